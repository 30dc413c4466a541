// The run defaults a preset stores in a training plan (Plan::runDefaults, written by
// `dgemma-compile --preset NAME`): they fill the `dgemma-run train` flags the command line leaves
// unset, through CLI11 so that they pass the same checks as typed ones. Explicit flags win.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "plan/Plan.h"

namespace dgemma::tool {

// Fills the unset flags of the parsed `train` command from the plan; rank 0 prints those it filled.
// Two defaults follow other flags rather than the preset: with an explicit --steps the decay spans
// it (the preset's --decay-steps is for its own step count), and --save-every needs a --save-dir.
// Throws InputError naming `planPath` for a default that is no train flag or fails its check.
void applyPlanRunDefaults(CLI::App& train, const Plan& plan, const std::string& planPath);

}  // namespace dgemma::tool
