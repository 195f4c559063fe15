// cublas.h in the CPU emulator: cuBLAS runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support cuBLAS (cublas.h); this code runs only on a GPU"
