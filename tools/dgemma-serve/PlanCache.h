// The inference plans dgemma-serve runs, compiled on first use and kept in a cache directory
// (docs/serving.md, "Plans"): the key is the XXH3-64 of the model's config files, the compile
// options and the dgemma-serve executable, so a changed config, flag or build compiles afresh and an
// unchanged one starts at once.
#pragma once

#include <string>

#include "compiler/Driver/CompileOptions.h"

namespace dgemma::tool {

// `options` (an infer plan; its output is set here) compiled into `cacheDir`/<key>, or the plan
// already there. Written into a temporary directory beside it and renamed into place, so a plan
// directory is whole or absent; two servers compiling the same key both end with a whole plan.
// Returns the plan directory. Throws InputError for options the compiler rejects.
std::string cachedPlan(CompileOptions options, const std::string& cacheDir);

// $XDG_CACHE_HOME/dgemma/plans, else $HOME/.cache/dgemma/plans.
std::string defaultPlanCacheDir();

}  // namespace dgemma::tool
