#include "models/builtin/RmsNormMatmulSoftmax.h"

#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::dg {

namespace {

void buildEntry(OpBuilder& builder, const RmsNormMatmulSoftmaxOptions& options, int64_t sequenceLength) {
  MLIRContext* context = builder.getContext();
  const int64_t batch = options.microBatch, hidden = options.hiddenSize, vocab = options.vocabSize;
  const std::string entryName = options.train ? "train_step" : "forward";
  auto loc = [&](const char* name) { return NameLoc::get(StringAttr::get(context, std::string("builtin.") + name)); };

  auto function = builder.create<func::FuncOp>(loc("entry"), entryName + "_s" + std::to_string(sequenceLength),
                                               builder.getFunctionType({}, {}));
  function->setAttr(kEntryAttr, builder.getStringAttr(entryName));
  function->setAttr(kBucketAttr, builder.getDictionaryAttr({
                                     builder.getNamedAttr("micro_batch", builder.getI64IntegerAttr(batch)),
                                     builder.getNamedAttr("prompt_len", builder.getI64IntegerAttr(sequenceLength)),
                                 }));
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(function.addEntryBlock());

  Type f32 = builder.getF32Type();
  auto activations = RankedTensorType::get({batch, sequenceLength, hidden}, f32);
  auto logitsType = RankedTensorType::get({batch, sequenceLength, vocab}, f32);
  auto init = [&](StringRef kind, std::optional<double> stddev = std::nullopt) {
    SmallVector<NamedAttribute> fields{builder.getNamedAttr("kind", builder.getStringAttr(kind))};
    if (stddev) fields.push_back(builder.getNamedAttr("std", builder.getF64FloatAttr(*stddev)));
    return builder.getDictionaryAttr(fields);
  };

  Value x = builder.create<InputOp>(loc("x"), activations, "x");
  Value normWeight = builder.create<ParamOp>(loc("norm.weight"), RankedTensorType::get({hidden}, f32), builder.getStringAttr("norm.weight"),
                                             init("ones"), builder.getBoolAttr(true));
  Value projection = builder.create<ParamOp>(loc("proj.weight"), RankedTensorType::get({hidden, vocab}, f32), builder.getStringAttr("proj.weight"),
                                             init("normal", 0.02), builder.getBoolAttr(true));
  Value normed = builder.create<RmsNormOp>(loc("rms_norm"), activations, x, normWeight, builder.getF64FloatAttr(options.eps));
  Value logits = builder.create<MatmulOp>(loc("matmul"), logitsType, normed, projection, builder.getBoolAttr(false),
                                          builder.getBoolAttr(false));
  Value probs = builder.create<SoftmaxOp>(loc("softmax"), logitsType, logits, builder.getI64IntegerAttr(-1));
  builder.create<OutputOp>(loc("probs"), "probs", probs);

  if (options.train) {
    Value target = builder.create<InputOp>(loc("target"), logitsType, "target");
    Value logProbs = builder.create<LogOp>(loc("log"), logitsType, probs);
    Value weighted = builder.create<MulOp>(loc("cross_entropy"), logitsType, target, logProbs);
    auto scalar = RankedTensorType::get({}, f32);
    Value total = builder.create<ReduceSumOp>(loc("cross_entropy"), scalar, weighted, builder.getDenseI64ArrayAttr({0, 1, 2}),
                                              builder.getBoolAttr(false));
    Value scale = builder.create<FillOp>(loc("cross_entropy"), scalar,
                                         builder.getF64FloatAttr(-1.0 / static_cast<double>(batch * sequenceLength)));
    Value loss = builder.create<MulOp>(loc("cross_entropy"), scalar, total, scale);
    builder.create<OutputOp>(loc("loss"), "loss", loss);
  }
  builder.create<func::ReturnOp>(loc("entry"));
}

}  // namespace

OwningOpRef<ModuleOp> buildRmsNormMatmulSoftmax(MLIRContext& context, const RmsNormMatmulSoftmaxOptions& options) {
  context.loadDialect<DgDialect, func::FuncDialect>();
  OpBuilder builder(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(NameLoc::get(builder.getStringAttr(kRmsNormMatmulSoftmaxName)));
  builder.setInsertionPointToEnd(module->getBody());
  for (int64_t length : options.sequenceLengths) buildEntry(builder, options, length);
  return module;
}

}  // namespace mlir::dg
