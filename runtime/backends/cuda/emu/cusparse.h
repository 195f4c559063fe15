// cusparse.h in the CPU emulator: cuSPARSE runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support cuSPARSE (cusparse.h); this code runs only on a GPU"
