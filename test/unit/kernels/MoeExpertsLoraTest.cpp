// moe_experts and moe_experts_backward with per-expert LoRA adapters (docs/kernels.md, "Expert
// adapters") against a plain double reference that evaluates each route on its own with scalar
// loops: the forward, every gradient (the base weights', the adapters', the input's and the routing
// weights'), a block of the experts (expert_offset > 0, with routes to experts outside the block),
// a frozen base (no base gradients asked for), one adapter pair alone, the kept pre-activations,
// and the factory's checks. The reference's own gradients are checked against central differences
// of the reference forward.
#include <cmath>
#include <numbers>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

struct LoraCase {
  int64_t tokens = 5, hidden = 6, topK = 2, experts = 4, inner = 3, rank = 2;
  double scale = 1.75;
  // Every expert gets routes; tokens 1 and 3 route to experts 0 and 1, outside the block [2, 4).
  std::vector<int64_t> indices = {0, 2, 1, 0, 3, 2, 1, 0, 2, 3};
};

struct LoraInputs {
  std::vector<double> x, weights, gateUp, down, gateUpA, gateUpB, downA, downB, dy;
};

LoraInputs makeInputs(const LoraCase& c) {
  LoraInputs in;
  const int64_t e = c.experts, h = c.hidden, i = c.inner, r = c.rank;
  in.x = randomValues<double>(c.tokens * h, 1);
  in.weights = randomValues<double>(c.tokens * c.topK, 2, 0.1, 1.0);
  in.gateUp = randomValues<double>(e * 2 * i * h, 3, -0.5, 0.5);
  in.down = randomValues<double>(e * h * i, 4, -0.5, 0.5);
  in.gateUpA = randomValues<double>(e * r * h, 5, -0.5, 0.5);
  in.gateUpB = randomValues<double>(e * 2 * i * r, 6, -0.5, 0.5);
  in.downA = randomValues<double>(e * r * i, 7, -0.5, 0.5);
  in.downB = randomValues<double>(e * h * r, 8, -0.5, 0.5);
  in.dy = randomValues<double>(c.tokens * h, 9);
  return in;
}

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)

double gelu(double g) { return 0.5 * g * (1 + std::tanh(kGeluC * (g + 0.044715 * g * g * g))); }

double geluDerivative(double g) {
  const double t = std::tanh(kGeluC * (g + 0.044715 * g * g * g));
  return 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * kGeluC * (1 + 3 * 0.044715 * g * g);
}

struct Reference {
  std::vector<double> y, rows, dx, dWeights, dGateUp, dDown, dGateUpA, dGateUpB, dDownA, dDownB;
};

// The op over the experts [offset, offset + count) of the inputs' c.experts, with the pairs asked for;
// gradients in the block's shapes.
Reference reference(const LoraCase& c, const LoraInputs& in, int64_t offset, int64_t count, bool gateUpPair,
                    bool downPair) {
  const int64_t h = c.hidden, i = c.inner, r = c.rank, w2 = 2 * c.inner;
  const double s = c.scale;
  Reference ref;
  ref.y.assign(c.tokens * h, 0);
  ref.rows.assign(c.tokens * c.topK * w2, 0);
  ref.dx.assign(c.tokens * h, 0);
  ref.dWeights.assign(c.tokens * c.topK, 0);
  ref.dGateUp.assign(count * w2 * h, 0);
  ref.dDown.assign(count * h * i, 0);
  ref.dGateUpA.assign(count * r * h, 0);
  ref.dGateUpB.assign(count * w2 * r, 0);
  ref.dDownA.assign(count * r * i, 0);
  ref.dDownB.assign(count * h * r, 0);
  for (int64_t route = 0; route < c.tokens * c.topK; ++route) {
    const int64_t n = route / c.topK, global = c.indices[route];
    if (global < offset || global >= offset + count) continue;
    const int64_t le = global - offset;  // the gradients' expert
    const int64_t e = global;            // the inputs hold every expert
    const double* x = in.x.data() + n * h;
    const double* GU = in.gateUp.data() + e * w2 * h;
    const double* D = in.down.data() + e * h * i;
    const double* A1 = in.gateUpA.data() + e * r * h;
    const double* B1 = in.gateUpB.data() + e * w2 * r;
    const double* A2 = in.downA.data() + e * r * i;
    const double* B2 = in.downB.data() + e * h * r;
    std::vector<double> t1(r, 0), pre(w2, 0), act(i), t2(r, 0), out(h, 0);
    if (gateUpPair)
      for (int64_t k = 0; k < r; ++k)
        for (int64_t j = 0; j < h; ++j) t1[k] += A1[k * h + j] * x[j];
    for (int64_t o = 0; o < w2; ++o) {
      for (int64_t j = 0; j < h; ++j) pre[o] += GU[o * h + j] * x[j];
      for (int64_t k = 0; k < r; ++k) pre[o] += s * B1[o * r + k] * t1[k];
      ref.rows[route * w2 + o] = pre[o];
    }
    for (int64_t q = 0; q < i; ++q) act[q] = gelu(pre[q]) * pre[i + q];
    if (downPair)
      for (int64_t k = 0; k < r; ++k)
        for (int64_t q = 0; q < i; ++q) t2[k] += A2[k * i + q] * act[q];
    for (int64_t j = 0; j < h; ++j) {
      for (int64_t q = 0; q < i; ++q) out[j] += D[j * i + q] * act[q];
      for (int64_t k = 0; k < r; ++k) out[j] += s * B2[j * r + k] * t2[k];
    }
    const double weight = in.weights[route];
    const double* dy = in.dy.data() + n * h;
    for (int64_t j = 0; j < h; ++j) {
      ref.y[n * h + j] += weight * out[j];
      ref.dWeights[route] += dy[j] * out[j];
    }
    std::vector<double> dOut(h), dt2(r, 0), dAct(i, 0), dPre(w2), dt1(r, 0);
    for (int64_t j = 0; j < h; ++j) dOut[j] = weight * dy[j];
    for (int64_t j = 0; j < h; ++j)
      for (int64_t q = 0; q < i; ++q) {
        ref.dDown[(le * h + j) * i + q] += dOut[j] * act[q];
        dAct[q] += dOut[j] * D[j * i + q];
      }
    if (downPair) {
      for (int64_t j = 0; j < h; ++j)
        for (int64_t k = 0; k < r; ++k) {
          ref.dDownB[(le * h + j) * r + k] += s * dOut[j] * t2[k];
          dt2[k] += s * dOut[j] * B2[j * r + k];
        }
      for (int64_t k = 0; k < r; ++k)
        for (int64_t q = 0; q < i; ++q) {
          ref.dDownA[(le * r + k) * i + q] += dt2[k] * act[q];
          dAct[q] += dt2[k] * A2[k * i + q];
        }
    }
    for (int64_t q = 0; q < i; ++q) {
      dPre[q] = dAct[q] * pre[i + q] * geluDerivative(pre[q]);
      dPre[i + q] = dAct[q] * gelu(pre[q]);
    }
    for (int64_t o = 0; o < w2; ++o)
      for (int64_t j = 0; j < h; ++j) {
        ref.dGateUp[(le * w2 + o) * h + j] += dPre[o] * x[j];
        ref.dx[n * h + j] += dPre[o] * GU[o * h + j];
      }
    if (gateUpPair) {
      for (int64_t o = 0; o < w2; ++o)
        for (int64_t k = 0; k < r; ++k) {
          ref.dGateUpB[(le * w2 + o) * r + k] += s * dPre[o] * t1[k];
          dt1[k] += s * dPre[o] * B1[o * r + k];
        }
      for (int64_t k = 0; k < r; ++k)
        for (int64_t j = 0; j < h; ++j) {
          ref.dGateUpA[(le * r + k) * h + j] += dt1[k] * x[j];
          ref.dx[n * h + j] += dt1[k] * A1[k * h + j];
        }
    }
  }
  return ref;
}

// The experts [first, first + count) of a per-expert tensor holding `perExpert` values each.
std::vector<double> block(const std::vector<double>& all, int64_t perExpert, int64_t first, int64_t count) {
  return std::vector<double>(all.begin() + first * perExpert, all.begin() + (first + count) * perExpert);
}

struct CallShape {
  int64_t offset = 0, count = 4;
  bool gateUpPair = true, downPair = true;
  bool gradGateUp = true, gradDown = true;
  bool keepRows = false;
};

nlohmann::json attributes(const LoraCase& c, const CallShape& shape, bool backward) {
  nlohmann::json attrs = {{"expert_offset", shape.offset},
                          {"lora_gate_up", shape.gateUpPair},
                          {"lora_down", shape.downPair},
                          {"lora_scale", c.scale}};
  if (backward) {
    attrs["grad_gate_up"] = shape.gradGateUp;
    attrs["grad_down"] = shape.gradDown;
  }
  return attrs;
}

void addExpertInputs(KernelCall& call, const LoraCase& c, const LoraInputs& in, const CallShape& shape) {
  const int64_t h = c.hidden, i = c.inner, w2 = 2 * c.inner, n = shape.count, first = shape.offset;
  call.input(DType::F64, {c.tokens, h}, in.x).input(DType::F64, {c.tokens, c.topK}, in.weights);
  call.input(DType::I64, {c.tokens, c.topK}, c.indices);
  call.input(DType::F64, {n, w2, h}, block(in.gateUp, w2 * h, first, n));
  call.input(DType::F64, {n, h, i}, block(in.down, h * i, first, n));
}

void addAdapterInputs(KernelCall& call, const LoraCase& c, const LoraInputs& in, const CallShape& shape) {
  const int64_t h = c.hidden, i = c.inner, r = c.rank, w2 = 2 * c.inner, n = shape.count, first = shape.offset;
  if (shape.gateUpPair) {
    call.input(DType::F64, {n, r, h}, block(in.gateUpA, r * h, first, n));
    call.input(DType::F64, {n, w2, r}, block(in.gateUpB, w2 * r, first, n));
  }
  if (shape.downPair) {
    call.input(DType::F64, {n, r, i}, block(in.downA, r * i, first, n));
    call.input(DType::F64, {n, h, r}, block(in.downB, h * r, first, n));
  }
}

struct KernelResults {
  std::vector<double> y, rows;
};

KernelResults runForward(const LoraCase& c, const LoraInputs& in, const CallShape& shape) {
  KernelCall call("moe_experts", attributes(c, shape, false));
  addExpertInputs(call, c, in, shape);
  addAdapterInputs(call, c, in, shape);
  call.output(DType::F64, {c.tokens, c.hidden});
  if (shape.keepRows) call.output(DType::F64, {c.tokens * c.topK, 2 * c.inner});
  call.run();
  return {call.result<double>(0), shape.keepRows ? call.result<double>(1) : std::vector<double>()};
}

// The backward's outputs in order, named: dx, dweights, then those the shape asks for.
std::vector<std::pair<std::string, std::vector<double>>> runBackward(const LoraCase& c, const LoraInputs& in,
                                                                     const CallShape& shape,
                                                                     const std::vector<double>& keptRows = {}) {
  const int64_t h = c.hidden, i = c.inner, r = c.rank, w2 = 2 * c.inner, n = shape.count;
  KernelCall call("moe_experts_backward", attributes(c, shape, true));
  addExpertInputs(call, c, in, shape);
  call.input(DType::F64, {c.tokens, h}, in.dy);
  if (!keptRows.empty()) call.input(DType::F64, {c.tokens * c.topK, w2}, keptRows);
  addAdapterInputs(call, c, in, shape);
  std::vector<std::string> names = {"dx", "dweights"};
  call.output(DType::F64, {c.tokens, h}).output(DType::F64, {c.tokens, c.topK});
  if (shape.gradGateUp) names.push_back("dgate_up"), call.output(DType::F64, {n, w2, h});
  if (shape.gradDown) names.push_back("ddown"), call.output(DType::F64, {n, h, i});
  if (shape.gateUpPair) {
    names.insert(names.end(), {"dA1", "dB1"});
    call.output(DType::F64, {n, r, h}).output(DType::F64, {n, w2, r});
  }
  if (shape.downPair) {
    names.insert(names.end(), {"dA2", "dB2"});
    call.output(DType::F64, {n, r, i}).output(DType::F64, {n, h, r});
  }
  call.run();
  std::vector<std::pair<std::string, std::vector<double>>> results;
  for (size_t k = 0; k < names.size(); ++k) results.emplace_back(names[k], call.result<double>(k));
  return results;
}

void expectClose(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_NEAR(got[k], want[k], 1e-12 * std::max(1.0, std::abs(want[k]))) << what << " element " << k;
}

const std::vector<double>& referenceOf(const Reference& ref, const std::string& name) {
  if (name == "dx") return ref.dx;
  if (name == "dweights") return ref.dWeights;
  if (name == "dgate_up") return ref.dGateUp;
  if (name == "ddown") return ref.dDown;
  if (name == "dA1") return ref.dGateUpA;
  if (name == "dB1") return ref.dGateUpB;
  if (name == "dA2") return ref.dDownA;
  return ref.dDownB;
}

void expectMatchesReference(const LoraCase& c, const LoraInputs& in, const CallShape& shape) {
  const Reference ref = reference(c, in, shape.offset, shape.count, shape.gateUpPair, shape.downPair);
  const KernelResults forward = runForward(c, in, shape);
  expectClose(forward.y, ref.y, "y");
  if (shape.keepRows) {
    // The kept rows hold the adapter's term, and routes outside the block get zero rows.
    std::vector<double> rows = ref.rows;
    for (int64_t route = 0; route < c.tokens * c.topK; ++route)
      if (c.indices[route] < shape.offset || c.indices[route] >= shape.offset + shape.count)
        std::fill_n(rows.begin() + route * 2 * c.inner, 2 * c.inner, 0.0);
    expectClose(forward.rows, rows, "gate_up_rows");
  }
  for (const auto& [name, values] : runBackward(c, in, shape, shape.keepRows ? forward.rows : std::vector<double>()))
    expectClose(values, referenceOf(ref, name), name);
}

TEST(MoeExpertsLora, BothPairsOverEveryExpertMatchTheReference) {
  const LoraCase c;
  expectMatchesReference(c, makeInputs(c), CallShape{});
}

TEST(MoeExpertsLora, ABlockOfExpertsSkipsTheRoutesToOtherBlocks) {
  const LoraCase c;
  CallShape shape;
  shape.offset = 2;
  shape.count = 2;
  expectMatchesReference(c, makeInputs(c), shape);
  // The reference itself leaves the outside routes out: their weight gradients are zero.
  const Reference ref = reference(c, makeInputs(c), 2, 2, true, true);
  EXPECT_EQ(ref.dWeights[0], 0.0);  // token 0, j = 0 routes to expert 0
  EXPECT_NE(ref.dWeights[1], 0.0);
}

TEST(MoeExpertsLora, AFrozenBaseGetsOnlyTheAdaptersGradients) {
  const LoraCase c;
  CallShape shape;
  shape.gradGateUp = false;
  shape.gradDown = false;
  shape.offset = 1;
  shape.count = 3;
  const auto results = runBackward(c, makeInputs(c), shape);
  ASSERT_EQ(results.size(), 6u);
  EXPECT_EQ(results[2].first, "dA1");
  expectMatchesReference(c, makeInputs(c), shape);
}

TEST(MoeExpertsLora, OnePairAlone) {
  const LoraCase c;
  CallShape downOnly;
  downOnly.gateUpPair = false;
  expectMatchesReference(c, makeInputs(c), downOnly);
  CallShape gateUpOnly;
  gateUpOnly.downPair = false;
  gateUpOnly.gradDown = false;
  expectMatchesReference(c, makeInputs(c), gateUpOnly);
}

TEST(MoeExpertsLora, TheKeptPreActivationsHoldTheAdapterTerm) {
  const LoraCase c;
  CallShape shape;
  shape.keepRows = true;
  shape.offset = 2;
  shape.count = 2;
  expectMatchesReference(c, makeInputs(c), shape);
}

// The reference's gradients are those of its forward: central differences of sum(dy ⊙ y).
TEST(MoeExpertsLora, TheReferenceGradientsAreTheForwardsDerivatives) {
  const LoraCase c;
  const LoraInputs in = makeInputs(c);
  const Reference ref = reference(c, in, 0, c.experts, true, true);
  auto objective = [&](const LoraInputs& perturbed) {
    const Reference value = reference(c, perturbed, 0, c.experts, true, true);
    double sum = 0;
    for (size_t k = 0; k < value.y.size(); ++k) sum += in.dy[k] * value.y[k];
    return sum;
  };
  const std::pair<std::vector<double> LoraInputs::*, const std::vector<double>*> checked[] = {
      {&LoraInputs::x, &ref.dx},         {&LoraInputs::weights, &ref.dWeights}, {&LoraInputs::gateUp, &ref.dGateUp},
      {&LoraInputs::down, &ref.dDown},   {&LoraInputs::gateUpA, &ref.dGateUpA}, {&LoraInputs::gateUpB, &ref.dGateUpB},
      {&LoraInputs::downA, &ref.dDownA}, {&LoraInputs::downB, &ref.dDownB}};
  const double step = 1e-6;
  for (const auto& [member, gradient] : checked)
    for (size_t k = 0; k < (in.*member).size(); ++k) {
      LoraInputs plus = in, minus = in;
      (plus.*member)[k] += step;
      (minus.*member)[k] -= step;
      EXPECT_NEAR((objective(plus) - objective(minus)) / (2 * step), (*gradient)[k], 1e-7);
    }
}

TEST(MoeExpertsLora, TheFactoryNamesAWrongAdapter) {
  const LoraCase c;
  const LoraInputs in = makeInputs(c);
  CallShape shape;
  KernelCall wrongRank("moe_experts", attributes(c, shape, false));
  addExpertInputs(wrongRank, c, in, shape);
  wrongRank.input(DType::F64, {4, 2, 6}, in.gateUpA).input(DType::F64, {4, 6, 2}, in.gateUpB);
  wrongRank.input(DType::F64, {4, 3, 3}, std::vector<double>(36)).input(DType::F64, {4, 6, 3}, std::vector<double>(72));
  wrongRank.output(DType::F64, {c.tokens, c.hidden});
  EXPECT_EQ(factoryError(wrongRank), "step 0 (moe_experts): input lora_down A has shape [4,3,3], expected [4,2,3]");

  KernelCall wrongB("moe_experts", attributes(c, shape, false));
  addExpertInputs(wrongB, c, in, shape);
  wrongB.input(DType::F64, {4, 2, 6}, in.gateUpA).input(DType::F64, {4, 2, 6}, in.gateUpB);
  wrongB.input(DType::F64, {4, 2, 3}, in.downA).input(DType::F64, {4, 6, 2}, in.downB);
  wrongB.output(DType::F64, {c.tokens, c.hidden});
  EXPECT_EQ(factoryError(wrongB), "step 0 (moe_experts): input lora_gate_up B has shape [4,2,6], expected [4,6,2]");

  KernelCall missingPair("moe_experts", attributes(c, shape, false));
  addExpertInputs(missingPair, c, in, shape);
  missingPair.input(DType::F64, {4, 2, 6}, in.gateUpA).input(DType::F64, {4, 6, 2}, in.gateUpB);
  missingPair.output(DType::F64, {c.tokens, c.hidden});
  EXPECT_EQ(factoryError(missingPair),
            "step 0 (moe_experts): expected 9 inputs (5 and two per adapter pair) and 1 or 2 outputs (y, optionally "
            "gate_up_rows), got 7 inputs and 1 outputs");

  nlohmann::json noScale = attributes(c, shape, false);
  noScale.erase("lora_scale");
  KernelCall withoutScale("moe_experts", noScale);
  addExpertInputs(withoutScale, c, in, shape);
  addAdapterInputs(withoutScale, c, in, shape);
  withoutScale.output(DType::F64, {c.tokens, c.hidden});
  EXPECT_NE(factoryError(withoutScale).find("lora_scale"), std::string::npos);
}

}  // namespace
}  // namespace dgemma::test
