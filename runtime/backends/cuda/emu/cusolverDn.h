// cusolverDn.h in the CPU emulator: cuSOLVER runs its own GPU code, which the emulator cannot.
#error "the CPU emulator does not support cuSOLVER (cusolverDn.h); this code runs only on a GPU"
