// A small built-in graph, rms_norm -> matmul -> softmax, that exercises the whole pipeline (IR,
// passes, plan, runtime) before the DiffusionGemma builder exists, and stays as its smoke test.
#ifndef MODELS_BUILTIN_RMSNORMMATMULSOFTMAX_H
#define MODELS_BUILTIN_RMSNORMMATMULSOFTMAX_H

#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir::dg {

struct RmsNormMatmulSoftmaxOptions {
  int64_t microBatch = 2;
  std::vector<int64_t> sequenceLengths = {8};  // one entry point per length (shape bucket)
  int64_t hiddenSize = 64;
  int64_t vocabSize = 128;
  double eps = 1e-6;
  bool train = false;  // add the target input and a cross-entropy "loss" output
};

inline constexpr const char* kRmsNormMatmulSoftmaxName = "builtin:rmsnorm-matmul-softmax";

// Inputs: "x" f32 [B, S, H] (and, for training, "target" f32 [B, S, V], a distribution per row).
// Parameters: "norm.weight" [H] (init ones), "proj.weight" [H, V] (init normal 0.02).
// Outputs: "probs" [B, S, V] = softmax(rms_norm(x) . proj); training adds
// "loss" = -sum(target * log(probs)) / (B * S).
// Entry points are named "forward" (infer) or "train_step" (train), bucketed by micro_batch and
// prompt_len.
OwningOpRef<ModuleOp> buildRmsNormMatmulSoftmax(MLIRContext& context, const RmsNormMatmulSoftmaxOptions& options);

}  // namespace mlir::dg

#endif
