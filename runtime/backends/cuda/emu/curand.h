// curand.h in the CPU emulator: cuRAND runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support cuRAND (curand.h); this code runs only on a GPU"
