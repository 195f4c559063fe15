// cudnn.h in the CPU emulator: cuDNN runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support cuDNN (cudnn.h); this code runs only on a GPU"
