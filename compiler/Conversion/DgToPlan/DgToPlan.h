// Lowers a planned dg module (after dg-memory-plan) to the executable plan of one rank.
#ifndef COMPILER_CONVERSION_DGTOPLAN_DGTOPLAN_H
#define COMPILER_CONVERSION_DGTOPLAN_DGTOPLAN_H

#include <string>

#include <nlohmann/json.hpp>

#include "mlir/IR/BuiltinOps.h"
#include "plan/Plan.h"

namespace mlir::dg {

struct PlanLoweringOptions {
  std::string producer = "dgemma-compile";
  nlohmann::json metadata = nlohmann::json::object();  // copied into the plan (config, flags)
};

// Every dg.entry function becomes an entry point: each compute op a kernel step (the op name without
// "dg."; its attributes as the step's attributes), each collective a collective step, reshapes views,
// params and constants persistent buffers. Emits an error on the op and fails for anything the plan
// cannot express (missing dg.offsets, an unsupported element type, a multi-rank mesh).
FailureOr<dgemma::Plan> lowerToPlan(ModuleOp module, const PlanLoweringOptions& options);

}  // namespace mlir::dg

#endif
