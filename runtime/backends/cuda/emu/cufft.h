// cufft.h in the CPU emulator: cuFFT runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support cuFFT (cufft.h); this code runs only on a GPU"
