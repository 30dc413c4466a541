// Lowers a planned dg module (after dg-memory-plan) to the executable plan of one rank.
#ifndef COMPILER_CONVERSION_DGTOPLAN_DGTOPLAN_H
#define COMPILER_CONVERSION_DGTOPLAN_DGTOPLAN_H

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "mlir/IR/BuiltinOps.h"
#include "plan/Plan.h"

namespace mlir::dg {

struct PlanLoweringOptions {
  std::string producer = "dgemma-compile";
  nlohmann::json metadata = nlohmann::json::object();  // copied into the plan (config, flags)
  // For a module that already is one rank's program (explicit collectives, as dg-shard-partition
  // produces), the rank to lower it for: its mesh coordinates are row-major over the dg.mesh axes in
  // the order the plan lists them. Unset, the mesh must have one rank. The boxes the partitioner
  // recorded (dg.global_shape, dg.shard_offset) become the parameters' and the entry inputs' and
  // outputs' boxes.
  std::optional<int64_t> rank;
  // --optimizer-offload: the trainable parameters whose AdamW moments live in the host arena and
  // whose update runs there on a host master and host copies of its other operands
  // (docs/parallelism.md, "Optimizer-state offload"). Their f32 weights and gradients stay on the
  // device too.
  std::set<std::string> offloadedParameters;
};

// Every dg.entry function becomes an entry point: each compute op a kernel step (the op name without
// "dg."; every attribute of the op, defaults included, as the step's attributes), each collective a
// collective step, reshapes views, params and constants persistent buffers. Emits an error on the op
// and fails for anything the plan cannot express (missing dg.offsets, an unsupported element type, an
// attribute of a kind without a plan encoding, a multi-rank mesh without a rank).
FailureOr<dgemma::Plan> lowerToPlan(ModuleOp module, const PlanLoweringOptions& options);

// Whether the lowering makes a kernel step, run by the kernel named as the op without "dg.", of
// every op named `name`: not for the ops that become buffers or views (param, constant, input,
// output, assign, reshape, stop_gradient) nor for the collectives, which become collective steps.
bool lowersToKernelStep(RegisteredOperationName name);

}  // namespace mlir::dg

#endif
