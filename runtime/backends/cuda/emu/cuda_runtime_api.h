// cuda_runtime_api.h for the course's CPU emulator: a kernel's own file has this include removed, but a
// header of the kernel's project may include it too; the emulator provides its names.
#pragma once
#include "cuda_emu.h"
