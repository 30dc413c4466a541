// Every derivative rule (DerivativeOpInterface) checked numerically through the real pipeline: a
// one-op graph in f64, loss = sum(op(params) * C) for a fixed random C, differentiated by
// dg-autodiff, memory-planned, lowered to a plan and run on the CPU backend. Each gradient element is
// compared with a central finite difference of the same plan's loss.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/exec/Executor.h"

namespace dgemma {
namespace {

using namespace mlir;
using namespace mlir::dg;

struct ParamSpec {
  std::vector<int64_t> shape;
  double low = -1.0, high = 1.0;  // the range values are drawn from (positive for log, sqrt, ...)
  // A frozen copy: a non-trainable parameter holding parameter copyOf's values, which the finite
  // differences never move (the value a stop_gradient use of that parameter sees).
  std::optional<size_t> copyOf = std::nullopt;
};

// Autodiff's gradient of one trainable parameter and the central finite difference of the loss.
struct Derivatives {
  std::vector<double> analytic, numeric;

  // max |analytic - numeric| / max |numeric|.
  double relativeError() const {
    double scale = 0, worst = 0;
    for (double value : numeric) scale = std::max(scale, std::abs(value));
    for (size_t j = 0; j < numeric.size(); ++j) worst = std::max(worst, std::abs(analytic[j] - numeric[j]) / scale);
    return worst;
  }
};

// Builds the op under test from the parameters; returns its result.
using OpBody = std::function<Value(OpBuilder&, Location, ArrayRef<Value>)>;

RankedTensorType f64Type(MLIRContext* context, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, Float64Type::get(context));
}

class GradientChecker {
 public:
  GradientChecker(std::vector<ParamSpec> params, OpBody body) : params_(std::move(params)) {
    context_.loadDialect<DgDialect, func::FuncDialect>();
    OpBuilder builder(&context_);
    Location loc = builder.getUnknownLoc();
    module_ = ModuleOp::create(loc);
    builder.setInsertionPointToEnd(module_->getBody());
    auto function = builder.create<func::FuncOp>(loc, "train_step", builder.getFunctionType({}, {}));
    function->setAttr(kEntryAttr, builder.getStringAttr("train_step"));
    builder.setInsertionPointToStart(function.addEntryBlock());

    SmallVector<Value> values;
    for (size_t i = 0; i < params_.size(); ++i)
      values.push_back(builder.create<ParamOp>(loc, f64Type(&context_, params_[i].shape), builder.getStringAttr(name(i)),
                                               DictionaryAttr(), builder.getBoolAttr(!params_[i].copyOf)));
    Value result = body(builder, loc, values);
    auto resultType = cast<RankedTensorType>(result.getType());
    if (!resultType.getElementType().isF64()) result = builder.create<CastOp>(loc, f64Type(&context_, resultType.getShape()), result);

    // loss = sum(result * C): C makes every output element matter differently.
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    SmallVector<double> weights(resultType.getNumElements());
    for (double& w : weights) w = uniform(rng);
    auto weightType = f64Type(&context_, resultType.getShape());
    Value weightsValue = builder.create<ConstantOp>(loc, DenseElementsAttr::get(weightType, ArrayRef<double>(weights)));
    Value weighted = builder.create<MulOp>(loc, weightType, result, weightsValue);
    SmallVector<int64_t> allDims = llvm::to_vector(llvm::seq<int64_t>(0, resultType.getRank()));
    Value loss = allDims.empty() ? weighted
                                 : builder.create<ReduceSumOp>(loc, f64Type(&context_, {}), weighted,
                                                               builder.getDenseI64ArrayAttr(allDims), builder.getBoolAttr(false))
                                       .getResult();
    builder.create<OutputOp>(loc, "loss", loss);
    builder.create<func::ReturnOp>(loc);

    PipelineOptions pipeline;
    pipeline.train = true;
    EXPECT_TRUE(succeeded(verify(*module_)));
    EXPECT_TRUE(succeeded(runDifferentiationStage(*module_, pipeline)));
    EXPECT_TRUE(succeeded(runPlanningStage(*module_, pipeline)));
    auto plan = lowerToPlan(*module_, PlanLoweringOptions{});
    EXPECT_TRUE(succeeded(plan));
    plan_ = std::move(*plan);
  }

  // For every trainable parameter: max |analytic - numeric| / max |numeric| <= tolerance.
  void check(double tolerance, double relativeStep = 1e-6) {
    for (const auto& [parameter, derivatives] : derivatives(relativeStep))
      EXPECT_LE(derivatives.relativeError(), tolerance) << parameter;
  }

  // Per trainable parameter name, at values drawn in parameter order from one fixed generator (a
  // frozen copy takes its original's values). `relativeStep` scales the central-difference step by
  // max(1, |value|).
  std::map<std::string, Derivatives> derivatives(double relativeStep = 1e-6) {
    backend_ = createBackend("cpu", 2);
    Executor executor(plan_, *backend_, communicators_, "gradient-check");
    std::mt19937 rng(11);
    std::vector<HostTensor> values;
    for (size_t i = 0; i < params_.size(); ++i) {
      HostTensor value(DType::F64, params_[i].shape);
      std::uniform_real_distribution<double> uniform(params_[i].low, params_[i].high);
      for (int64_t j = 0; j < value.numElements(); ++j)
        value.as<double>()[j] = params_[i].copyOf ? values[*params_[i].copyOf].as<double>()[j] : uniform(rng);
      executor.setParameter(name(i), value);
      values.push_back(value);
    }
    const EntryPoint& entry = plan_.entryPoints.front();
    std::map<std::string, HostTensor> outputs = executor.run(entry, {});
    auto lossAt = [&](size_t i, int64_t j, double delta) {
      HostTensor moved = values[i];
      moved.as<double>()[j] += delta;
      executor.setParameter(name(i), moved);
      double loss = executor.run(entry, {}).at("loss").as<double>()[0];
      executor.setParameter(name(i), values[i]);
      return loss;
    };
    std::map<std::string, Derivatives> result;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].copyOf) continue;
      const HostTensor& gradient = outputs.at("grad/" + name(i));
      EXPECT_EQ(gradient.shape, params_[i].shape);
      Derivatives& derivatives = result[name(i)];
      derivatives.analytic.assign(gradient.as<double>(), gradient.as<double>() + gradient.numElements());
      for (int64_t j = 0; j < gradient.numElements(); ++j) {
        const double step = relativeStep * std::max(1.0, std::abs(values[i].as<double>()[j]));
        derivatives.numeric.push_back((lossAt(i, j, step) - lossAt(i, j, -step)) / (2 * step));
      }
      EXPECT_TRUE(llvm::any_of(derivatives.numeric, [](double value) { return value != 0; }))
          << name(i) << ": the loss does not depend on it";
    }
    return result;
  }

 private:
  static std::string name(size_t i) { return std::string("p").append(std::to_string(i)); }

  MLIRContext context_;
  OwningOpRef<ModuleOp> module_;
  std::vector<ParamSpec> params_;
  Plan plan_;
  std::unique_ptr<Backend> backend_;
  CommunicatorSet communicators_;
};

// Finite differences in f64 with a 1e-6 step are good to about 1e-8 relative; 1e-7 leaves margin
// while catching any wrong factor, sign or missing term.
constexpr double kTolerance = 1e-7;

RankedTensorType typeLike(Value value, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, cast<RankedTensorType>(value.getType()).getElementType());
}
ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

template <typename Op>
OpBody binary() {
  return [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    auto shape = *broadcastShapes(shapeOf(p[0]), shapeOf(p[1]));
    return b.create<Op>(loc, typeLike(p[0], shape), p[0], p[1]);
  };
}
template <typename Op>
OpBody unary() {
  return [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value { return b.create<Op>(loc, p[0].getType(), p[0]); };
}

TEST(GradientCheck, AddSubMulDivWithBroadcasting) {
  std::vector<ParamSpec> broadcast = {{{2, 3, 4}}, {{3, 1}}};
  GradientChecker(broadcast, binary<AddOp>()).check(kTolerance);
  GradientChecker(broadcast, binary<SubOp>()).check(kTolerance);
  GradientChecker({{{2, 3}}, {{1, 3}}}, binary<MulOp>()).check(kTolerance);
  GradientChecker({{{4, 3}}, {{3}, 0.5, 2.0}}, binary<DivOp>()).check(kTolerance);
  GradientChecker({{{}}, {{2, 2}}}, binary<MulOp>()).check(kTolerance);  // a scalar broadcast everywhere
}

TEST(GradientCheck, UnaryFunctions) {
  GradientChecker({{{3, 4}}}, unary<NegOp>()).check(kTolerance);
  GradientChecker({{{3, 4}}}, unary<ExpOp>()).check(kTolerance);
  GradientChecker({{{3, 4}, 0.5, 2.0}}, unary<LogOp>()).check(kTolerance);
  GradientChecker({{{3, 4}, -2.0, 2.0}}, unary<TanhOp>()).check(kTolerance);
  GradientChecker({{{3, 4}, 0.5, 2.0}}, unary<SqrtOp>()).check(kTolerance);
  GradientChecker({{{3, 4}, 0.5, 2.0}}, unary<RsqrtOp>()).check(kTolerance);
  GradientChecker({{{3, 5}, -3.0, 3.0}}, unary<GeluTanhOp>()).check(kTolerance);
}

TEST(GradientCheck, MatmulLayouts) {
  auto matmul = [](bool ta, bool tb) -> OpBody {
    return [ta, tb](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      auto lhs = shapeOf(p[0]), rhs = shapeOf(p[1]);
      SmallVector<int64_t> shape(lhs.drop_back(2));
      shape.push_back(lhs[lhs.size() - (ta ? 1 : 2)]);
      shape.push_back(rhs[rhs.size() - (tb ? 2 : 1)]);
      return b.create<MatmulOp>(loc, typeLike(p[0], shape), p[0], p[1], b.getBoolAttr(ta), b.getBoolAttr(tb));
    };
  };
  GradientChecker({{{3, 4}}, {{4, 5}}}, matmul(false, false)).check(kTolerance);
  GradientChecker({{{4, 3}}, {{4, 5}}}, matmul(true, false)).check(kTolerance);
  GradientChecker({{{3, 4}}, {{5, 4}}}, matmul(false, true)).check(kTolerance);
  GradientChecker({{{2, 3, 4}}, {{4, 5}}}, matmul(false, false)).check(kTolerance);     // shared rhs
  GradientChecker({{{2, 4, 3}}, {{5, 4}}}, matmul(true, true)).check(kTolerance);       // shared rhs, both transposed
  GradientChecker({{{2, 3, 4}}, {{2, 4, 5}}}, matmul(false, false)).check(kTolerance);  // batched rhs
}

TEST(GradientCheck, NormsAndSoftmax) {
  auto rmsNorm = [](bool weighted) -> OpBody {
    return [weighted](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      return b.create<RmsNormOp>(loc, p[0].getType(), p[0], weighted ? p[1] : Value(), b.getF64FloatAttr(1e-6));
    };
  };
  GradientChecker({{{3, 6}}, {{6}}}, rmsNorm(true)).check(kTolerance);
  GradientChecker({{{2, 2, 5}}}, rmsNorm(false)).check(kTolerance);
  auto softmax = [](int64_t axis) -> OpBody {
    return [axis](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      return b.create<SoftmaxOp>(loc, p[0].getType(), p[0], b.getI64IntegerAttr(axis));
    };
  };
  GradientChecker({{{3, 5}, -2.0, 2.0}}, softmax(-1)).check(kTolerance);
  GradientChecker({{{2, 4, 3}, -2.0, 2.0}}, softmax(1)).check(kTolerance);
}

TEST(GradientCheck, ReductionsAndLayout) {
  auto reduce = [](bool mean, std::vector<int64_t> dims, bool keep) -> OpBody {
    return [=](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      SmallVector<int64_t> shape;
      for (int64_t d = 0; d < static_cast<int64_t>(shapeOf(p[0]).size()); ++d) {
        bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
        if (!reduced) shape.push_back(shapeOf(p[0])[d]);
        else if (keep) shape.push_back(1);
      }
      auto type = typeLike(p[0], shape);
      if (mean) return b.create<ReduceMeanOp>(loc, type, p[0], b.getDenseI64ArrayAttr(dims), b.getBoolAttr(keep));
      return b.create<ReduceSumOp>(loc, type, p[0], b.getDenseI64ArrayAttr(dims), b.getBoolAttr(keep));
    };
  };
  GradientChecker({{{2, 3, 4}}}, reduce(false, {1}, false)).check(kTolerance);
  GradientChecker({{{2, 3, 4}}}, reduce(true, {0, 2}, true)).check(kTolerance);
  auto transpose = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    return b.create<TransposeOp>(loc, typeLike(p[0], {4, 2, 3}), p[0], b.getDenseI64ArrayAttr({2, 0, 1}));
  };
  GradientChecker({{{2, 3, 4}}}, transpose).check(kTolerance);
  // A reshape between two ops, so that the view carries a gradient through the plan.
  auto reshapeThenExp = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    Value reshaped = b.create<ReshapeOp>(loc, typeLike(p[0], {6, 2}), p[0]);
    return b.create<ExpOp>(loc, reshaped.getType(), reshaped);
  };
  GradientChecker({{{3, 4}}}, reshapeThenExp).check(kTolerance);
  // f64 -> f32 -> f64: the gradient passes through both casts. The f32 leg rounds the loss to about
  // 1e-7, so the step must be large (the square is exact under central differences at any step).
  auto castRoundTrip = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    Value narrow = b.create<CastOp>(loc, RankedTensorType::get(shapeOf(p[0]), b.getF32Type()), p[0]);
    Value squared = b.create<MulOp>(loc, narrow.getType(), narrow, narrow);
    return b.create<CastOp>(loc, p[0].getType(), squared);
  };
  GradientChecker({{{5}}}, castRoundTrip).check(1e-3, 1e-2);
}

// Model-level ops: RoPE (full and partial rotation; positions are not differentiated), concat and
// slice.
TEST(GradientCheck, RopeConcatAndSlice) {
  auto rope = [](int64_t pairs) -> OpBody {
    return [pairs](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      SmallVector<int64_t> positions;
      for (int64_t row = 0; row < 2; ++row)
        for (int64_t t = 0; t < 3; ++t) positions.push_back(5 * row + 7 * t);
      auto positionType = RankedTensorType::get({2, 3}, b.getI64Type());
      Value positionValues = b.create<ConstantOp>(loc, DenseElementsAttr::get(positionType, ArrayRef<int64_t>(positions)));
      return b.create<RopeOp>(loc, p[0].getType(), p[0], positionValues, b.getF64FloatAttr(100.0), b.getI64IntegerAttr(pairs),
                              b.getI64IntegerAttr(8), b.getBoolAttr(false));
    };
  };
  GradientChecker({{{2, 3, 2, 8}}}, rope(4)).check(kTolerance);
  GradientChecker({{{2, 3, 2, 8}}}, rope(2)).check(kTolerance);
  auto concat = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    Value joined = b.create<ConcatOp>(loc, typeLike(p[0], {2, 5, 3}), ValueRange{p[0], p[1]}, b.getI64IntegerAttr(1));
    return b.create<TanhOp>(loc, joined.getType(), joined);  // so each block's cotangent differs
  };
  GradientChecker({{{2, 2, 3}}, {{2, 3, 3}}}, concat).check(kTolerance);
  // Slices from the middle, the start and the end of a dimension; the rest of it gets zeros.
  auto slice = [](int64_t start, int64_t size) -> OpBody {
    return [=](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      Value block = b.create<SliceOp>(loc, typeLike(p[0], {2, size, 3}), p[0], b.getI64IntegerAttr(1), b.getI64IntegerAttr(start));
      return b.create<TanhOp>(loc, block.getType(), block);
    };
  };
  GradientChecker({{{2, 5, 3}}}, slice(1, 2)).check(kTolerance);
  GradientChecker({{{2, 5, 3}}}, slice(0, 3)).check(kTolerance);
  GradientChecker({{{2, 5, 3}}}, slice(2, 3)).check(kTolerance);
}

// Attention with each mask kind, GQA, a window, padded keys and a pad query (its diagonal), K = V,
// the causal mask's image overlay (segment ids), and packed documents (document ids) under the
// causal and the windowed bidirectional mask.
TEST(GradientCheck, AttentionMasks) {
  auto attention = [](AttentionMask mask, int64_t window, int64_t prefixLength, std::vector<bool> valid,
                      bool sharedKeyValue, std::vector<int64_t> segments = {},
                      std::vector<int64_t> documents = {}) -> OpBody {
    return [=](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      auto validType = RankedTensorType::get({1, static_cast<int64_t>(valid.size())}, b.getI1Type());
      SmallVector<bool> bits(valid.begin(), valid.end());
      Value keyValid = b.create<ConstantOp>(loc, DenseElementsAttr::get(validType, ArrayRef<bool>(bits)));
      Value segmentIds;
      if (!segments.empty()) {
        auto segmentType = RankedTensorType::get({1, static_cast<int64_t>(segments.size())}, b.getI64Type());
        segmentIds = b.create<ConstantOp>(loc, DenseElementsAttr::get(segmentType, ArrayRef<int64_t>(segments)));
      }
      Value documentIds;
      if (!documents.empty()) {
        auto documentType = RankedTensorType::get({1, static_cast<int64_t>(documents.size())}, b.getI64Type());
        documentIds = b.create<ConstantOp>(loc, DenseElementsAttr::get(documentType, ArrayRef<int64_t>(documents)));
      }
      Value value = sharedKeyValue ? p[1] : p[2];
      auto q = shapeOf(p[0]);
      auto type = typeLike(p[0], {q[0], q[1], q[2], shapeOf(value)[3]});
      return b.create<AttentionOp>(loc, type, p[0], p[1], value, keyValid, AttentionMaskAttr::get(b.getContext(), mask),
                                   b.getI64IntegerAttr(window), b.getI64IntegerAttr(prefixLength),
                                   b.getF64FloatAttr(0.7), segmentIds, documentIds);
    };
  };
  // Causal, GQA 2:1, window 3, the first key padded (so query 0 sees only its own diagonal).
  GradientChecker({{{1, 5, 4, 3}}, {{1, 5, 2, 3}}, {{1, 5, 2, 2}}}, attention(AttentionMask::Causal, 3, 0, {false, true, true, true, true}, false))
      .check(kTolerance);
  // Queries as the last positions (Tq < Tk), unlimited window, K = V.
  GradientChecker({{{1, 2, 2, 3}}, {{1, 4, 1, 3}}}, attention(AttentionMask::Causal, 0, 0, {true, true, true, true}, true)).check(kTolerance);
  GradientChecker({{{1, 3, 2, 3}}, {{1, 4, 2, 3}}, {{1, 4, 2, 3}}}, attention(AttentionMask::Bidirectional, 0, 0, {true, false, true, true}, false))
      .check(kTolerance);
  // The decoder's prefix mask: 4 prefix slots (one padded), the last 2 visible, then 3 block keys.
  GradientChecker({{{1, 3, 2, 3}}, {{1, 7, 1, 3}}, {{1, 7, 1, 3}}},
                  attention(AttentionMask::Prefix, 2, 4, {true, true, false, true, true, true, true}, false))
      .check(kTolerance);
  // The image overlay on a windowed causal mask: segment 1 spans the pad query 0 and keys 1..3 (query 1
  // sees the future keys 2 and 3, query 3 sees key 1 outside its window of 2), segment 2 keys 5 and 6.
  GradientChecker({{{1, 7, 2, 3}}, {{1, 7, 1, 3}}, {{1, 7, 1, 2}}},
                  attention(AttentionMask::Causal, 2, 0, {false, true, true, true, true, true, true}, false,
                            {1, 1, 1, 1, 0, 2, 2}))
      .check(kTolerance);
  // Queries as the last 3 of 5 positions, K = V: query 0 (key position 2) sees the future key 3 of its segment.
  GradientChecker({{{1, 3, 2, 3}}, {{1, 5, 1, 3}}},
                  attention(AttentionMask::Causal, 0, 0, {true, true, true, true, true}, true, {0, 1, 1, 1, 0}))
      .check(kTolerance);
  // Three packed documents {0, 0, 1, 1, 1, 2} and a padded last key, causal with window 2 and
  // bidirectional with the symmetric window 2: no query reads across a document boundary.
  GradientChecker(
      {{{1, 6, 2, 3}}, {{1, 6, 1, 3}}, {{1, 6, 1, 2}}},
      attention(AttentionMask::Causal, 2, 0, {true, true, true, true, true, false}, false, {}, {0, 0, 1, 1, 1, 2}))
      .check(kTolerance);
  GradientChecker({{{1, 6, 2, 3}}, {{1, 6, 1, 3}}, {{1, 6, 1, 2}}},
                  attention(AttentionMask::Bidirectional, 2, 0, {true, true, true, true, true, false}, false, {},
                            {0, 0, 1, 1, 1, 2}))
      .check(kTolerance);
  GradientChecker({{{1, 6, 2, 3}}, {{1, 6, 1, 3}}, {{1, 6, 1, 2}}},
                  attention(AttentionMask::Bidirectional, 0, 0, {true, true, true, true, true, true}, false, {},
                            {0, 0, 1, 1, 1, 2}))
      .check(kTolerance);
}

// MoE: the router (softmax over all experts, top-k, renormalise, scale; the choice itself has no
// gradient), the routed experts, and the two chained as in a Gemma 4 layer.
TEST(GradientCheck, MoeRouterAndExperts) {
  auto route = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    auto logits = shapeOf(p[0]);
    auto op = b.create<MoeRouteOp>(loc, typeLike(p[0], {logits[0], 2}), RankedTensorType::get({logits[0], 2}, b.getI64Type()),
                                   p[0], p[1], b.getI64IntegerAttr(2));
    return op.getWeights();
  };
  GradientChecker({{{5, 4}, -2.0, 2.0}, {{4}, 0.5, 1.5}}, route).check(kTolerance);

  auto experts = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    // Token 2 picks expert 1 twice; expert 3 is never used (its gradients must be zero).
    SmallVector<int64_t> chosen = {0, 1, 2, 0, 1, 1, 2, 0};
    auto indexType = RankedTensorType::get({4, 2}, b.getI64Type());
    Value indices = b.create<ConstantOp>(loc, DenseElementsAttr::get(indexType, ArrayRef<int64_t>(chosen)));
    return b.create<MoeExpertsOp>(loc, p[0], p[1], indices, p[2], p[3]).getResult();
  };
  GradientChecker({{{4, 3}}, {{4, 2}, 0.2, 1.0}, {{4, 4, 3}}, {{4, 3, 2}}}, experts).check(kTolerance);

  auto layer = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    Value logits = b.create<MatmulOp>(loc, typeLike(p[0], {4, 3}), p[0], p[1], b.getBoolAttr(false), b.getBoolAttr(true));
    auto routed = b.create<MoeRouteOp>(loc, typeLike(p[0], {4, 2}), RankedTensorType::get({4, 2}, b.getI64Type()), logits,
                                       p[2], b.getI64IntegerAttr(2));
    return b.create<MoeExpertsOp>(loc, p[0], routed.getWeights(), routed.getIndices(), p[3], p[4]).getResult();
  };
  GradientChecker({{{4, 3}}, {{3, 3}}, {{3}, 0.5, 1.5}, {{3, 4, 3}}, {{3, 3, 2}}}, layer).check(kTolerance);
}

// The routed experts with per-expert LoRA adapters on gate_up and down (rank 2, scale 1.5): every
// operand's gradient, the adapters' included; then a block of the experts (expert_offset 1, routes
// to expert 0 outside it) with the down pair alone.
TEST(GradientCheck, MoeExpertsWithAdapters) {
  auto experts = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    SmallVector<int64_t> chosen = {0, 1, 2, 0, 1, 1, 2, 3};
    auto indexType = RankedTensorType::get({4, 2}, b.getI64Type());
    Value indices = b.create<ConstantOp>(loc, DenseElementsAttr::get(indexType, ArrayRef<int64_t>(chosen)));
    return b
        .create<MoeExpertsOp>(loc, p[0].getType(), Type(), p[0], p[1], indices, p[2], p[3], p[4], p[5], p[6], p[7],
                              IntegerAttr(), b.getF64FloatAttr(1.5))
        .getResult();
  };
  GradientChecker(
      {{{4, 3}}, {{4, 2}, 0.2, 1.0}, {{4, 4, 3}}, {{4, 3, 2}}, {{4, 2, 3}}, {{4, 4, 2}}, {{4, 2, 2}}, {{4, 3, 2}}},
      experts)
      .check(kTolerance);

  auto block = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    SmallVector<int64_t> chosen = {0, 1, 2, 0, 1, 1, 2, 3};
    auto indexType = RankedTensorType::get({4, 2}, b.getI64Type());
    Value indices = b.create<ConstantOp>(loc, DenseElementsAttr::get(indexType, ArrayRef<int64_t>(chosen)));
    return b
        .create<MoeExpertsOp>(loc, p[0].getType(), Type(), p[0], p[1], indices, p[2], p[3], Value(), Value(), p[4],
                              p[5], b.getI64IntegerAttr(1), b.getF64FloatAttr(0.75))
        .getResult();
  };
  GradientChecker({{{4, 3}}, {{4, 2}, 0.2, 1.0}, {{3, 4, 3}}, {{3, 3, 2}}, {{3, 2, 2}}, {{3, 3, 2}}}, block)
      .check(kTolerance);

  // A frozen base (non-trainable copies of p2 and p3): its backward has no base gradients
  // (canonicalization drops them) and its step says so to the kernel; a second, plain experts op on
  // the trainable originals keeps the loss depending on them.
  auto frozenBase = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    SmallVector<int64_t> chosen = {0, 1, 2, 0, 1, 1, 2, 3};
    auto indexType = RankedTensorType::get({4, 2}, b.getI64Type());
    Value indices = b.create<ConstantOp>(loc, DenseElementsAttr::get(indexType, ArrayRef<int64_t>(chosen)));
    Value adapted = b.create<MoeExpertsOp>(loc, p[0].getType(), Type(), p[0], p[1], indices, p[4], p[5], p[6], p[7],
                                           p[8], p[9], IntegerAttr(), b.getF64FloatAttr(1.5))
                        .getResult();
    Value plain = b.create<MoeExpertsOp>(loc, p[0], p[1], indices, p[2], p[3]).getResult();
    return b.create<AddOp>(loc, adapted, plain);
  };
  GradientChecker({{{4, 3}},
                   {{4, 2}, 0.2, 1.0},
                   {{4, 4, 3}},
                   {{4, 3, 2}},
                   {{4, 4, 3}, -1.0, 1.0, 2},
                   {{4, 3, 2}, -1.0, 1.0, 3},
                   {{4, 2, 3}},
                   {{4, 4, 2}},
                   {{4, 2, 2}},
                   {{4, 3, 2}}},
                  frozenBase)
      .check(kTolerance);
}

// The expert dispatch on one rank (docs/parallelism.md, "Expert parallelism"): the rows permuted
// to their routes' slots, through the local experts, and combined with the weights.
TEST(GradientCheck, MoeDispatchPermuteLocalExpertsAndCombine) {
  auto dispatched = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    // Token 2 picks expert 1 twice; expert 3 is never used.
    SmallVector<int64_t> chosen = {0, 1, 2, 0, 1, 1, 2, 0};
    auto i64 = b.getI64Type();
    auto indexType = RankedTensorType::get({4, 2}, i64);
    Value indices = b.create<ConstantOp>(loc, DenseElementsAttr::get(indexType, ArrayRef<int64_t>(chosen)));
    auto routing = b.create<MoeDispatchOp>(loc, indexType, RankedTensorType::get({1}, i64), RankedTensorType::get({1, 4}, i64),
                                           indices, b.getI64IntegerAttr(4));
    Value rows = b.create<MoePermuteOp>(loc, typeLike(p[0], {8, 3}), p[0], routing.getSlots());
    Value outputs = b.create<MoeLocalExpertsOp>(loc, rows.getType(), rows, routing.getExpertCounts(), p[2], p[3]);
    return b.create<MoeCombineOp>(loc, p[0].getType(), outputs, routing.getSlots(), p[1]);
  };
  GradientChecker({{{4, 3}}, {{4, 2}, 0.2, 1.0}, {{4, 4, 3}}, {{4, 3, 2}}}, dispatched).check(kTolerance);
}

// The embedding lookup: rows read several times sum their cotangents; unread rows get zero.
TEST(GradientCheck, GatherEmbeddingRows) {
  auto gather = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    SmallVector<int64_t> ids = {3, 0, 3, 1, 3, 0};
    auto idType = RankedTensorType::get({2, 3}, b.getI64Type());
    Value idValues = b.create<ConstantOp>(loc, DenseElementsAttr::get(idType, ArrayRef<int64_t>(ids)));
    Value rows = b.create<GatherOp>(loc, typeLike(p[0], {2, 3, 4}), p[0], idValues);
    return b.create<TanhOp>(loc, rows.getType(), rows);
  };
  GradientChecker({{{5, 4}}}, gather).check(kTolerance);
}

// gather with padding_idx (torch's nn.Embedding(padding_idx)): the pad row gets no gradient from
// lookups although the forward reads it (its finite difference is not zero); every other row
// matches the finite differences.
TEST(GradientCheck, GatherPaddingRowGetsNoGradient) {
  constexpr int64_t kPadRow = 3, kWidth = 4;
  auto gather = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    SmallVector<int64_t> ids = {3, 0, 3, 1, 3, 0};
    auto idType = RankedTensorType::get({2, 3}, b.getI64Type());
    Value idValues = b.create<ConstantOp>(loc, DenseElementsAttr::get(idType, ArrayRef<int64_t>(ids)));
    Value rows = b.create<GatherOp>(loc, typeLike(p[0], {2, 3, kWidth}), p[0], idValues, b.getI64IntegerAttr(kPadRow));
    return b.create<TanhOp>(loc, rows.getType(), rows);
  };
  Derivatives table = GradientChecker({{{5, kWidth}}}, gather).derivatives().at("p0");
  Derivatives otherRows;
  for (int64_t j = 0; j < static_cast<int64_t>(table.analytic.size()); ++j) {
    if (j / kWidth == kPadRow) {
      EXPECT_EQ(table.analytic[j], 0.0) << "pad row element " << j % kWidth;
      EXPECT_NE(table.numeric[j], 0.0) << "pad row element " << j % kWidth;
    } else {
      otherRows.analytic.push_back(table.analytic[j]);
      otherRows.numeric.push_back(table.numeric[j]);
    }
  }
  EXPECT_LE(otherRows.relativeError(), kTolerance);
}

// scatter_add (the pooling of the vision tower): rows hit several times, ids outside the block
// [row_offset, row_offset + 4) dropped, and skip_id's updates discarded. Each update's derivative is
// the row it was added to; dropped and skipped updates have none (their finite differences are 0).
TEST(GradientCheck, ScatterAddRowsWithDroppedAndSkippedIds) {
  auto scatter = [](std::optional<int64_t> skip) -> OpBody {
    return [skip](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      SmallVector<int64_t> ids = {1, 3, 9, 3, 2, 0, 4, 3};
      auto idType = RankedTensorType::get({2, 4}, b.getI64Type());
      Value idValues = b.create<ConstantOp>(loc, DenseElementsAttr::get(idType, ArrayRef<int64_t>(ids)));
      Value table = b.create<ScatterAddOp>(loc, typeLike(p[0], {4, 3}), idValues, p[0],
                                           skip ? b.getI64IntegerAttr(*skip) : IntegerAttr(), b.getI64IntegerAttr(1));
      return b.create<TanhOp>(loc, table.getType(), table);
    };
  };
  GradientChecker({{{2, 4, 3}}}, scatter(std::nullopt)).check(kTolerance);
  // Block [1, 5): ids 9 (position 2) and 0 (position 5) are dropped; id 3 (positions 1, 3, 7) is skipped.
  Derivatives skipped = GradientChecker({{{2, 4, 3}}}, scatter(3)).derivatives().at("p0");
  EXPECT_LE(skipped.relativeError(), kTolerance);
  for (int64_t position = 0; position < 8; ++position) {
    const bool contributes = position == 0 || position == 4 || position == 6;
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_EQ(skipped.analytic[position * 3 + c] != 0.0, contributes) << "position " << position;
  }
}

// Cross-entropy over V = 5 at [2, 3] positions, with and without a bonus, with and without the
// soft-cap inside the op (a cap of 1.5 bends logits in [-4, 4] hard). The bonus is a constant (it is
// never differentiated); its ids equal the target at positions 0, 2 and 4 and differ elsewhere.
TEST(GradientCheck, CrossEntropyWithAndWithoutBonusAndSoftcap) {
  auto crossEntropy = [](bool withBonus, double softcap = 0.0) -> OpBody {
    return [withBonus, softcap](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      auto idType = RankedTensorType::get({2, 3}, b.getI64Type());
      Value targets = b.create<ConstantOp>(loc, DenseElementsAttr::get(idType, ArrayRef<int64_t>{0, 4, 2, 2, 1, 3}));
      Value bonusIds, bonus;
      if (withBonus) {
        bonusIds = b.create<ConstantOp>(loc, DenseElementsAttr::get(idType, ArrayRef<int64_t>{0, 1, 2, 4, 1, 0}));
        bonus = b.create<ConstantOp>(loc, DenseElementsAttr::get(typeLike(p[0], {2, 3}), ArrayRef<double>{2.0, -1.0, 0.5, 3.0, 1.5, 0.7}));
      }
      return b.create<CrossEntropyOp>(loc, typeLike(p[0], {2, 3}), p[0], targets, bonusIds, bonus, b.getF64FloatAttr(softcap));
    };
  };
  GradientChecker({{{2, 3, 5}, -2.0, 2.0}}, crossEntropy(false)).check(kTolerance);
  GradientChecker({{{2, 3, 5}, -2.0, 2.0}}, crossEntropy(true)).check(kTolerance);
  GradientChecker({{{2, 3, 5}, -4.0, 4.0}}, crossEntropy(false, 1.5)).check(kTolerance);
  GradientChecker({{{2, 3, 5}, -4.0, 4.0}}, crossEntropy(true, 1.5)).check(kTolerance);
}

// stop_gradient. A parameter used directly and through the barrier gets the direct use's gradient
// alone: the finite difference of the same loss with the detached value held fixed, which a frozen
// copy of the parameter provides. A parameter reached only through the barrier gets zeros.
TEST(GradientCheck, StopGradientKeepsOnlyTheDirectUse) {
  auto usedTwice = [](bool barrier) -> OpBody {
    return [barrier](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
      Value grown = b.create<ExpOp>(loc, p[0].getType(), barrier ? p[0] : p[1]);
      Value detached = barrier ? b.create<StopGradientOp>(loc, grown.getType(), grown).getResult() : grown;
      return b.create<MulOp>(loc, p[0].getType(), b.create<TanhOp>(loc, p[0].getType(), p[0]), detached);
    };
  };
  Derivatives withBarrier = GradientChecker({{{3, 4}}}, usedTwice(true)).derivatives().at("p0");
  Derivatives withCopy = GradientChecker({{{3, 4}}, {{3, 4}, -1.0, 1.0, 0}}, usedTwice(false)).derivatives().at("p0");
  EXPECT_LE((Derivatives{withBarrier.analytic, withCopy.numeric}.relativeError()), kTolerance);
  // Moving both uses together changes the loss differently: the barrier did cut the second path.
  EXPECT_GT(withBarrier.relativeError(), 0.1);

  auto onlyDetached = [](OpBuilder& b, Location loc, ArrayRef<Value> p) -> Value {
    Value detached = b.create<StopGradientOp>(loc, p[0].getType(), b.create<ExpOp>(loc, p[0].getType(), p[0]));
    return b.create<MulOp>(loc, p[1].getType(), b.create<TanhOp>(loc, p[1].getType(), p[1]), detached);
  };
  std::map<std::string, Derivatives> both = GradientChecker({{{3, 4}}, {{3, 4}}}, onlyDetached).derivatives();
  EXPECT_EQ(both.at("p0").analytic, std::vector<double>(12, 0.0));
  EXPECT_LE(both.at("p1").relativeError(), kTolerance);
}

}  // namespace
}  // namespace dgemma
