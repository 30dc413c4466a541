// The compiler driver (docs/architecture.md, "Compiler driver"): what dgemma-compile does once its
// flags are parsed. It builds the model's dg module, runs the pipeline stages (compiler/Pipeline),
// partitions it per rank, lowers each rank's program to a plan and writes the plans; `--emit`
// stops at a stage and prints it, `--report` prints the tables of Report.h, `--auto-layout`
// chooses the layout first (AutoLayout.h).
#pragma once

#include "compiler/Driver/CompileOptions.h"

namespace dgemma {

// The plan's files must not land on the model they are compiled from (docs/cli.md, "Outputs and
// inputs"). Checked before anything else reads the options.
void checkOutputAgainstModel(const CompileOptions& options);

// Compiles what `options` ask for. Bad input (options that do not fit each other or the model, a
// config that does not load, IR a stage rejects) throws InputError; the stages' diagnostics go to
// stderr first, as "loc: error: message".
void compile(CompileOptions options);

}  // namespace dgemma
