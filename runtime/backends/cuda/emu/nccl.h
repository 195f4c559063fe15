// nccl.h in the CPU emulator: NCCL runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support NCCL (nccl.h); this code runs only on a GPU"
