#include "models/diffusion_gemma/ir/GraphBuilder.h"

#include "dialects/dg/IR/DgDialect.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"

namespace mlir::dg::diffusion_gemma {

GraphBuilder::GraphBuilder(OpBuilder& builder, const dgemma::DiffusionGemmaConfig& config, int64_t batch,
                           Precision precision)
    : b_(builder), config_(config), batch_(batch), f32_(builder.getF32Type()),
      activation_(precision == Precision::Bf16 ? Type(builder.getBF16Type()) : Type(builder.getF32Type())) {}

Location GraphBuilder::loc(const std::string& name) { return NameLoc::get(b_.getStringAttr("diffusion_gemma." + name)); }

Value GraphBuilder::input(const std::string& name, ArrayRef<int64_t> shape, Type element) {
  return b_.create<InputOp>(loc(name), RankedTensorType::get(shape, element), b_.getStringAttr(name));
}

void GraphBuilder::output(const std::string& name, Value value) { b_.create<OutputOp>(loc(name), name, value); }

Value GraphBuilder::param(const std::string& name, ArrayRef<int64_t> shape, StringRef init, bool trainable,
                          int64_t logicalRows) {
  SmallVector<NamedAttribute> fields{b_.getNamedAttr("kind", b_.getStringAttr(init))};
  if (init == "normal") fields.push_back(b_.getNamedAttr("std", b_.getF64FloatAttr(config_.initializerRange)));
  if (logicalRows > 0 && logicalRows < shape.front())
    fields.push_back(b_.getNamedAttr("logical_rows", b_.getI64IntegerAttr(logicalRows)));
  auto master = b_.create<ParamOp>(loc(name), f32Type(shape), b_.getStringAttr(name), b_.getDictionaryAttr(fields),
                                   b_.getBoolAttr(trainable));
  master->setAttr(kRoleAttr, b_.getStringAttr(dgemma::tensorParallelRole(name)));
  return mixedPrecision() ? castTo(master, activation_, name + ".bf16") : master.getResult();
}

Value GraphBuilder::state(const std::string& name, ArrayRef<int64_t> shape, Type element) {
  auto state = b_.create<ParamOp>(loc(name), RankedTensorType::get(shape, element), b_.getStringAttr(name),
                                  b_.getDictionaryAttr({b_.getNamedAttr("kind", b_.getStringAttr("zeros"))}),
                                  b_.getBoolAttr(false));
  state->setAttr(kRoleAttr, b_.getStringAttr("replicated"));
  return state;
}

void GraphBuilder::assign(Value target, Value value, const std::string& name) { b_.create<AssignOp>(loc(name), target, value); }

Value GraphBuilder::islandParam(const std::string& name, ArrayRef<int64_t> shape, StringRef init) {
  return toF32(param(name, shape, init), name);
}

Value GraphBuilder::scalar(double value, const std::string& name, Type element) {
  return b_.create<FillOp>(loc(name), RankedTensorType::get({}, element ? element : f32_), b_.getF64FloatAttr(value));
}

Value GraphBuilder::ones(ArrayRef<int64_t> shape, const std::string& name) {
  return b_.create<FillOp>(loc(name), f32Type(shape), b_.getF64FloatAttr(1.0));
}

Value GraphBuilder::convert(Value value, Type element, const std::string& name) {
  return elementTypeOf(value) == element ? value : castTo(value, element, name);
}

Value GraphBuilder::castTo(Value value, Type element, const std::string& name) {
  return b_.create<CastOp>(loc(name), RankedTensorType::get(shapeOf(value), element), value);
}

template <typename BinaryOp>
Value GraphBuilder::binary(Value lhs, Value rhs, const std::string& name) {
  return b_.create<BinaryOp>(loc(name), lhs, rhs);
}

Value GraphBuilder::add(Value lhs, Value rhs, const std::string& name) { return binary<AddOp>(lhs, rhs, name); }
Value GraphBuilder::sub(Value lhs, Value rhs, const std::string& name) { return binary<SubOp>(lhs, rhs, name); }
Value GraphBuilder::mul(Value lhs, Value rhs, const std::string& name) { return binary<MulOp>(lhs, rhs, name); }
Value GraphBuilder::div(Value lhs, Value rhs, const std::string& name) { return binary<DivOp>(lhs, rhs, name); }
Value GraphBuilder::maximum(Value lhs, Value rhs, const std::string& name) { return binary<MaximumOp>(lhs, rhs, name); }
Value GraphBuilder::minimum(Value lhs, Value rhs, const std::string& name) { return binary<MinimumOp>(lhs, rhs, name); }
Value GraphBuilder::log(Value x, const std::string& name) { return b_.create<LogOp>(loc(name), x); }

Value GraphBuilder::compare(Value lhs, Value rhs, ComparePredicate predicate, const std::string& name) {
  return b_.create<CompareOp>(loc(name), lhs, rhs, ComparePredicateAttr::get(b_.getContext(), predicate));
}

Value GraphBuilder::reduceSum(Value x, ArrayRef<int64_t> dims, const std::string& name) {
  SmallVector<int64_t> shape;
  for (int64_t d = 0; d < static_cast<int64_t>(shapeOf(x).size()); ++d)
    if (!llvm::is_contained(dims, d)) shape.push_back(shapeOf(x)[d]);
  return b_.create<ReduceSumOp>(loc(name), f32Type(shape), x, b_.getDenseI64ArrayAttr(dims), b_.getBoolAttr(false));
}

Value GraphBuilder::reshape(Value value, ArrayRef<int64_t> shape, const std::string& name) {
  auto type = RankedTensorType::get(shape, cast<RankedTensorType>(value.getType()).getElementType());
  return b_.create<ReshapeOp>(loc(name), type, value);
}

Value GraphBuilder::concat(ArrayRef<Value> values, int64_t dim, const std::string& name) {
  return b_.create<ConcatOp>(loc(name), values, b_.getI64IntegerAttr(dim));
}

Value GraphBuilder::slice(Value value, int64_t dim, int64_t start, int64_t size, const std::string& name) {
  SmallVector<int64_t> shape(shapeOf(value));
  shape[dim] = size;
  return b_.create<SliceOp>(loc(name), RankedTensorType::get(shape, elementTypeOf(value)), value, b_.getI64IntegerAttr(dim),
                            b_.getI64IntegerAttr(start));
}

Value GraphBuilder::zeros(ArrayRef<int64_t> shape, Type element, const std::string& name) {
  return b_.create<FillOp>(loc(name), RankedTensorType::get(shape, element), b_.getF64FloatAttr(0.0));
}

Value GraphBuilder::positions(int64_t start, int64_t count) {
  SmallVector<int64_t> values;
  for (int64_t row = 0; row < batch_; ++row)
    for (int64_t i = 0; i < count; ++i) values.push_back(start + i);
  auto type = RankedTensorType::get({batch_, count}, b_.getI64Type());
  return b_.create<ConstantOp>(loc("positions"), DenseElementsAttr::get(type, ArrayRef<int64_t>(values)));
}

Value GraphBuilder::constantBool(ArrayRef<int64_t> shape, bool value, const std::string& name) {
  auto type = RankedTensorType::get(shape, b_.getI1Type());
  return b_.create<ConstantOp>(loc(name), DenseElementsAttr::get(type, value));
}

Value GraphBuilder::linear(Value x, const std::string& weightName, int64_t out, int64_t in) {
  return linear(x, param(weightName, {out, in}, "normal"), weightName);
}

Value GraphBuilder::linear(Value x, Value weight, const std::string& name) {
  return b_.create<MatmulOp>(loc(name), x, weight, b_.getBoolAttr(false), b_.getBoolAttr(true));
}

Value GraphBuilder::rmsNorm(Value x, Value weight, const std::string& name) {
  return b_.create<RmsNormOp>(loc(name), x, weight, b_.getF64FloatAttr(config_.rmsNormEps));
}

Value GraphBuilder::rmsNorm(Value x, const std::string& weightName) {
  return rmsNorm(x, param(weightName, {shapeOf(x).back()}, "ones"), weightName);
}

OwningOpRef<ModuleOp> createDiffusionGemmaModule(MLIRContext& context) {
  context.loadDialect<DgDialect, func::FuncDialect>();
  return ModuleOp::create(NameLoc::get(StringAttr::get(&context, "diffusion_gemma")));
}

}  // namespace mlir::dg::diffusion_gemma
