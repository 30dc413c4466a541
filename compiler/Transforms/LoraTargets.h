// The target vocabulary of dg-lora (docs/training.md, "LoRA adapters"), shared by the pass and by
// dgemma-compile, which records the resolved targets in the plan.
#pragma once

#include <string>
#include <vector>

#include "llvm/ADT/ArrayRef.h"

namespace mlir::dg {

// The single projection names `targets` stands for (groups expanded), sorted and without repeats.
// On an unknown name, returns nothing and sets `error`.
std::vector<std::string> expandLoraTargets(llvm::ArrayRef<std::string> targets, std::string& error);

}  // namespace mlir::dg
