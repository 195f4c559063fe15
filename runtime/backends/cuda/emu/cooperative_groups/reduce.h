// cooperative_groups/reduce.h: cg::reduce and its operators are in the emulator's
// cooperative_groups.h.
#pragma once
#include "../cooperative_groups.h"
