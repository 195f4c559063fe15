// cublasLt.h in the CPU emulator: cuBLASLt runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support cuBLASLt (cublasLt.h); this code runs only on a GPU"
