// cooperative_groups/scan.h: cg::inclusive_scan and its operators are in the emulator's
// cooperative_groups.h.
#pragma once
#include "../cooperative_groups.h"
