// The dg module a compile starts from (docs/architecture.md, "From config to plan to runtime"): the
// built-in graph or a DiffusionGemma config built for the options' mode, buckets and layout, with
// the options checked against the model first.
#pragma once

#include <optional>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "compiler/Driver/CompileOptions.h"
#include "plan/Plan.h"
#include "support/Json.h"

namespace dgemma {

// The typed plan fields that drive the runtime (docs/plan-format.md), gathered while the model is
// built and copied into each lowered plan.
struct RuntimeFields {
  ModelFamily family = ModelFamily::Builtin;
  nlohmann::json modelConfig;
  nlohmann::json modelGenerationConfig;
  std::optional<BucketPadding> bucketPadding;
  std::optional<OptimizerSettings> optimizer;
  std::optional<RunDefaults> runDefaults;
  std::optional<GenerationSettings> generation;
  std::optional<AdapterSettings> adapter;

  void copyInto(Plan& plan) const;
  // The text model's hidden size, for the report's analytic minimum (0 for the built-in graph).
  int64_t modelHiddenSize() const;
};

// Builds the module; records in `fields` what the runtime needs to know about the model and in
// `metadata` what is informational. Throws InputError when the options do not fit the model.
mlir::OwningOpRef<mlir::ModuleOp> buildModel(mlir::MLIRContext& context, const CompileOptions& options,
                                             RuntimeFields& fields, nlohmann::json& metadata);

// Every tensor of the built program must have a static shape whose bytes fit kMaxTensorBytes:
// the memory planner and the runtime size arenas from them. Checked before any pass runs, so a
// config or options too large to hold end here, naming the tensor, and not in a verifier dump.
void checkTensorSizes(mlir::ModuleOp module);

}  // namespace dgemma
