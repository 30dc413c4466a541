// The helpers every part of the DiffusionGemma graph uses to emit dg ops: locations, the precision
// policy (f32 parameter masters cast to the activation dtype at each use), the entry point's
// inputs, outputs and parameters, and the common ops (most infer their result types from the
// operands; the helpers state the type where an op cannot, e.g. a reshape or an f32 reduction of
// bf16 values). The text stack (TextStack.h), the objective (Objective.h) and the entry points
// (Builder.cpp) share one per entry point.
#ifndef MODELS_DIFFUSION_GEMMA_GRAPHBUILDER_H
#define MODELS_DIFFUSION_GEMMA_GRAPHBUILDER_H

#include <string>

#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/spec/Config.h"

namespace mlir::dg::diffusion_gemma {

inline ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }
inline Type elementTypeOf(Value value) { return cast<RankedTensorType>(value.getType()).getElementType(); }

class GraphBuilder {
 public:
  GraphBuilder(OpBuilder& builder, const dgemma::DiffusionGemmaConfig& config, int64_t batch, Precision precision);

  OpBuilder& builder() { return b_; }
  const dgemma::DiffusionGemmaConfig& config() const { return config_; }
  int64_t batch() const { return batch_; }
  Type f32() const { return f32_; }
  Type activation() const { return activation_; }  // f32, or bf16 in mixed precision
  bool mixedPrecision() const { return activation_ != f32_; }

  // Every op is named "diffusion_gemma.<name>".
  Location loc(const std::string& name);
  RankedTensorType f32Type(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, f32_); }
  RankedTensorType activationType(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, activation_); }

  Value input(const std::string& name, ArrayRef<int64_t> shape, Type element);
  void output(const std::string& name, Value value);
  // A parameter as the forward uses it: the f32 master (HF's initialisation: linear and embedding
  // weights N(0, 0.02); norm weights and scales 1), cast to the activation dtype at this use.
  // `logicalRows` < shape[0] marks the rows from it on as padding (docs/parallelism.md, "Vocabulary
  // padding"): the init spec's "logical_rows" tells the runtime to keep them zero and out of checkpoints.
  Value param(const std::string& name, ArrayRef<int64_t> shape, StringRef init, bool trainable = true,
              int64_t logicalRows = 0);
  // Run state kept between entry points (the K/V cache, the last step's logits): a persistent,
  // non-trainable parameter stored in `element` itself (no f32 master), zero when a run starts.
  Value state(const std::string& name, ArrayRef<int64_t> shape, Type element);
  // The state `target` (from state()) takes `value` when this op runs.
  void assign(Value target, Value value, const std::string& name);
  // A parameter read by an fp32 island: the value the forward uses (bf16-rounded in mixed
  // precision, as every parameter is), widened to f32.
  Value islandParam(const std::string& name, ArrayRef<int64_t> shape, StringRef init);

  Value scalar(double value, const std::string& name, Type element = {});
  Value ones(ArrayRef<int64_t> shape, const std::string& name);
  Value toF32(Value value, const std::string& name) { return convert(value, f32_, name + ".f32"); }
  Value toActivation(Value value, const std::string& name) { return convert(value, activation_, name + ".bf16"); }
  // `value` itself when it already has the element type, else a cast.
  Value convert(Value value, Type element, const std::string& name);
  Value castTo(Value value, Type element, const std::string& name);

  // Elementwise with broadcasting, in the lhs's element type.
  Value add(Value lhs, Value rhs, const std::string& name);
  Value sub(Value lhs, Value rhs, const std::string& name);
  Value mul(Value lhs, Value rhs, const std::string& name);
  Value div(Value lhs, Value rhs, const std::string& name);
  Value maximum(Value lhs, Value rhs, const std::string& name);
  Value minimum(Value lhs, Value rhs, const std::string& name);
  Value log(Value x, const std::string& name);
  // i1 result of `lhs <predicate> rhs` (broadcasting).
  Value compare(Value lhs, Value rhs, ComparePredicate predicate, const std::string& name);
  // An f32 sum over `dims`, which are dropped (widened from a 16-bit input).
  Value reduceSum(Value x, ArrayRef<int64_t> dims, const std::string& name);

  Value reshape(Value value, ArrayRef<int64_t> shape, const std::string& name);
  Value concat(ArrayRef<Value> values, int64_t dim, const std::string& name);
  // The block [start, start + size) of dimension `dim`.
  Value slice(Value value, int64_t dim, int64_t start, int64_t size, const std::string& name);
  // A float tensor of zeros.
  Value zeros(ArrayRef<int64_t> shape, Type element, const std::string& name);
  // Positions start..start+count-1 on every row: [B, count] i64.
  Value positions(int64_t start, int64_t count);
  Value constantBool(ArrayRef<int64_t> shape, bool value, const std::string& name);

  // y = x W^T for an HF linear weight W [out, in], in x's dtype.
  Value linear(Value x, const std::string& weightName, int64_t out, int64_t in);
  Value linear(Value x, Value weight, const std::string& name);
  // RMS norm over the last dimension with the config's eps: with a weight, with the parameter
  // `weightName` (initialised to ones), or weightless.
  Value rmsNorm(Value x, Value weight, const std::string& name);
  Value rmsNorm(Value x, const std::string& weightName);
  Value weightlessNorm(Value x, const std::string& name) { return rmsNorm(x, Value(), name); }

 private:
  template <typename BinaryOp>
  Value binary(Value lhs, Value rhs, const std::string& name);

  OpBuilder& b_;
  const dgemma::DiffusionGemmaConfig& config_;
  int64_t batch_;
  Type f32_;
  Type activation_;
};

// A new module for DiffusionGemma entry points.
OwningOpRef<ModuleOp> createDiffusionGemmaModule(MLIRContext& context);

// Adds an entry-point function `symbol` (entry `entry`, bucket `bucket`) to `module` and fills it
// with `body`, which builds its ops at the builder's insertion point.
template <typename Body>
void addEntryFunction(OpBuilder& builder, ModuleOp module, const std::string& symbol, StringRef entry,
                      ArrayRef<std::pair<StringRef, int64_t>> bucket, Body body) {
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(module.getBody());
  Location loc = NameLoc::get(builder.getStringAttr("diffusion_gemma." + entry.str()));
  auto function = builder.create<func::FuncOp>(loc, symbol, builder.getFunctionType({}, {}));
  function->setAttr(kEntryAttr, builder.getStringAttr(entry));
  SmallVector<NamedAttribute> dimensions;
  for (auto [name, size] : bucket) dimensions.push_back(builder.getNamedAttr(name, builder.getI64IntegerAttr(size)));
  function->setAttr(kBucketAttr, builder.getDictionaryAttr(dimensions));
  builder.setInsertionPointToStart(function.addEntryBlock());
  body();
  builder.create<func::ReturnOp>(loc);
}

}  // namespace mlir::dg::diffusion_gemma

#endif
