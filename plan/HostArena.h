// The host arena: the one pool of a plan that lives in the host's memory instead of the device's.
// dgemma-compile --optimizer-offload puts the offloaded AdamW moments and the staging of their
// update there (docs/parallelism.md, "Optimizer-state offload"; docs/plan-format.md, "Header").
#pragma once

#include "plan/Plan.h"

namespace dgemma {

inline constexpr const char* kHostArenaName = "host";

inline bool isHostArena(const Arena& arena) { return arena.name == kHostArenaName; }

// The host arena's copy of a device buffer is named after it with this prefix. The copy of a
// parameter updated in place ("offload/<parameter>") is that parameter's host master: the plan does
// not copy it in before each update, so the runtime writes it whenever it writes the parameter.
inline constexpr const char* kHostCopyPrefix = "offload/";

}  // namespace dgemma
