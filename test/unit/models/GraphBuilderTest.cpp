// The shared graph builder emits ops without stating their result types: the ops infer them
// (InferTypeOpInterface). Checks the inferred types, and that a widened result a builder states
// (an f32 matmul of bf16 operands, dg-f32-gradient-accumulation) still verifies.
#include <gtest/gtest.h>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "models/diffusion_gemma/ir/GraphBuilder.h"
#include "models/diffusion_gemma/ir/TextStack.h"

namespace mlir::dg::diffusion_gemma {
namespace {

class GraphBuilderTest : public ::testing::Test {
 protected:
  GraphBuilderTest() {
    context_.loadDialect<DgDialect, func::FuncDialect>();
    config_ = dgemma::loadDiffusionGemmaConfig(DGEMMA_SOURCE_DIR "/models/diffusion_gemma/configs/tiny-cpu.json");
    module_ = ModuleOp::create(UnknownLoc::get(&context_));
    builder_.setInsertionPointToEnd(module_->getBody());
    auto function = builder_.create<func::FuncOp>(UnknownLoc::get(&context_), "f", builder_.getFunctionType({}, {}));
    builder_.setInsertionPointToStart(function.addEntryBlock());
  }

  // Whether the function built so far verifies, closed by a return that is removed again.
  bool verifies() {
    auto terminator = builder_.create<func::ReturnOp>(UnknownLoc::get(&context_));
    bool valid = succeeded(verify(*module_));
    terminator.erase();
    return valid;
  }

  RankedTensorType typeOf(Value value) { return cast<RankedTensorType>(value.getType()); }
  RankedTensorType tensor(ArrayRef<int64_t> shape, Type element) { return RankedTensorType::get(shape, element); }

  MLIRContext context_;
  dgemma::DiffusionGemmaConfig config_;
  OwningOpRef<ModuleOp> module_;
  OpBuilder builder_{&context_};
};

TEST_F(GraphBuilderTest, InfersResultTypesFromOperands) {
  GraphBuilder g(builder_, config_, /*batch=*/2, Precision::Bf16);
  Type bf16 = builder_.getBF16Type(), f32 = builder_.getF32Type();
  Value x = g.castTo(g.input("x", {2, 3, 8}, f32), bf16, "x.bf16");
  Value row = g.castTo(g.input("row", {8}, f32), bf16, "row.bf16");

  EXPECT_EQ(typeOf(g.add(x, row, "sum")), tensor({2, 3, 8}, bf16));
  EXPECT_EQ(typeOf(g.compare(g.input("t", {2, 1, 1}, f32), g.input("u", {3, 1}, f32), ComparePredicate::Lt, "lt")),
            tensor({2, 3, 1}, builder_.getI1Type()));
  // A linear layer: x W^T with W [out, in] from its HF name, in the activation dtype.
  EXPECT_EQ(typeOf(g.linear(x, "proj.weight", 5, 8)), tensor({2, 3, 5}, bf16));
  EXPECT_EQ(typeOf(g.rmsNorm(x, "norm.weight")), tensor({2, 3, 8}, bf16));
  EXPECT_EQ(typeOf(g.concat({x, x}, 1, "joined")), tensor({2, 6, 8}, bf16));
  EXPECT_TRUE(verifies());
}

// `--init random` draws every normal-initialised weight with the config's initializer_range, as
// HF's _init_weights does.
TEST_F(GraphBuilderTest, NormalInitUsesTheConfigsInitializerRange) {
  config_.initializerRange = 0.125;
  GraphBuilder g(builder_, config_, /*batch=*/1, Precision::Fp32);
  Value weight = g.param("proj.weight", {4, 8}, "normal", /*trainable=*/true);
  DictionaryAttr init = cast<ParamOp>(weight.getDefiningOp()).getInitAttr();
  ASSERT_TRUE(init);
  EXPECT_EQ(cast<StringAttr>(init.get("kind")).getValue(), "normal");
  EXPECT_EQ(cast<FloatAttr>(init.get("std")).getValueAsDouble(), 0.125);
}

TEST_F(GraphBuilderTest, InfersModelOpResultTypes) {
  GraphBuilder g(builder_, config_, /*batch=*/1, Precision::Fp32);
  Type f32 = builder_.getF32Type();
  // Grouped-query attention: 4 query heads over 2 KV heads of value width 6.
  Value query = g.input("q", {1, 5, 4, 8}, f32), key = g.input("k", {1, 7, 2, 8}, f32), value = g.input("v", {1, 7, 2, 6}, f32);
  Value keyValid = g.constantBool({1, 7}, true, "valid");
  auto attention = builder_.create<AttentionOp>(g.loc("attention"), query, key, value, keyValid,
                                                AttentionMaskAttr::get(&context_, AttentionMask::Bidirectional),
                                                builder_.getI64IntegerAttr(0), builder_.getI64IntegerAttr(0),
                                                builder_.getF64FloatAttr(1.0), /*segment_ids=*/Value(),
                                                /*document_ids=*/Value());
  EXPECT_EQ(attention.getType(), tensor({1, 5, 4, 6}, f32));

  auto route = builder_.create<MoeRouteOp>(g.loc("route"), g.input("logits", {6, 8}, f32), g.input("scale", {8}, f32),
                                           builder_.getI64IntegerAttr(2));
  EXPECT_EQ(route.getWeights().getType(), tensor({6, 2}, f32));
  EXPECT_EQ(route.getIndices().getType(), tensor({6, 2}, builder_.getI64Type()));

  auto loss = builder_.create<CrossEntropyOp>(g.loc("ce"), g.input("z", {2, 3, 11}, f32),
                                              g.input("ids", {2, 3}, builder_.getI64Type()), Value(), Value(),
                                              builder_.getF64FloatAttr(0.0));
  EXPECT_EQ(loss.getType(), tensor({2, 3}, f32));
  auto sum = builder_.create<ReduceSumOp>(g.loc("sum"), g.input("w", {2, 3, 4}, f32), builder_.getDenseI64ArrayAttr({1}),
                                          builder_.getBoolAttr(true));
  EXPECT_EQ(sum.getType(), tensor({2, 1, 4}, f32));
  EXPECT_TRUE(verifies());
}

// The encoder's image overlay: encoderStack hands its segment ids to every layer's attention, and
// without them builds the plain causal op.
TEST_F(GraphBuilderTest, EncoderStackPassesSegmentIdsToEveryLayer) {
  GraphBuilder g(builder_, config_, /*batch=*/2, Precision::Fp32);
  TextStack text(g);
  Type i64 = builder_.getI64Type();
  Value ids = g.input("input_ids", {2, 8}, i64), segments = g.input("image_segment_ids", {2, 8}, i64);
  Value keyValid = g.constantBool({2, 8}, true, "valid");
  text.encoderStack(ids, keyValid, g.positions(0, 8), nullptr, segments);
  text.encoderStack(ids, keyValid, g.positions(0, 8), nullptr);
  int64_t withSegments = 0, without = 0;
  module_->walk([&](AttentionOp attention) {
    EXPECT_EQ(attention.getMask(), AttentionMask::Causal);
    if (!attention.getSegmentIds()) return void(++without);
    EXPECT_EQ(attention.getSegmentIds(), segments);
    ++withSegments;
  });
  EXPECT_EQ(withSegments, config_.numHiddenLayers);
  EXPECT_EQ(without, config_.numHiddenLayers);
  EXPECT_TRUE(verifies());
}

TEST_F(GraphBuilderTest, WidenedResultsVerifyAndOthersDoNot) {
  GraphBuilder g(builder_, config_, /*batch=*/1, Precision::Bf16);
  Type bf16 = builder_.getBF16Type(), f32 = builder_.getF32Type();
  Value a = g.castTo(g.input("a", {4, 8}, f32), bf16, "a.bf16"), b = g.castTo(g.input("b", {8, 3}, f32), bf16, "b.bf16");
  builder_.create<MatmulOp>(g.loc("widened"), tensor({4, 3}, f32), a, b, builder_.getBoolAttr(false),
                            builder_.getBoolAttr(false));
  EXPECT_TRUE(verifies());

  // A narrowed result (f32 operands, bf16 result) is neither the inferred type nor a widening.
  Value c = g.input("c", {4, 8}, f32), d = g.input("d", {8, 3}, f32);
  builder_.create<MatmulOp>(g.loc("narrowed"), tensor({4, 3}, bf16), c, d, builder_.getBoolAttr(false),
                            builder_.getBoolAttr(false));
  std::string error;
  ScopedDiagnosticHandler capture(&context_, [&](Diagnostic& diagnostic) {
    error = diagnostic.str();
    return success();
  });
  EXPECT_FALSE(verifies());
  EXPECT_EQ(error, "'dg.matmul' op operands and result must share the element type (or an f32 result for 16-bit operands)");
}

}  // namespace
}  // namespace mlir::dg::diffusion_gemma
