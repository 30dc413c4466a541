// runtime/kernels/attention/AttentionMath.h, the arithmetic of the CUDA attention kernels, against
// the CPU kernel without a GPU: the visibility predicate equals the CPU kernel's key sets for every
// (query, key) in every mask mode, the candidate key ranges cover them, and host emulations of the
// tiled forward and backward kernels (attention/cuda.cu's phases, in its order, through the same
// functions) give the CPU kernel's outputs.
#include <cmath>

#include "KernelTestSupport.h"
#include "runtime/kernels/attention/AttentionMath.h"

namespace dgemma::test {
namespace {

using attention::KeyRange;
using attention::OnlineSoftmax;
using attention::TileShape;

struct Case {
  AttentionContract g;
  std::vector<uint8_t> keyValid;  // [B, Tk]
};

AttentionContract geometry(int64_t batch, int64_t queries, int64_t keys, int64_t queryHeads, int64_t kvHeads,
                           int64_t headDim, int64_t valueDim, AttentionMask mask, int64_t window, int64_t prefixLen,
                           double scale) {
  AttentionContract g;
  g.batch = batch;
  g.queries = queries;
  g.keys = keys;
  g.queryHeads = queryHeads;
  g.kvHeads = kvHeads;
  g.headDim = headDim;
  g.valueDim = valueDim;
  g.mask = mask;
  g.window = window;
  g.prefixLen = prefixLen;
  g.scale = scale;
  return g;
}

const char* maskName(AttentionMask mask) {
  return mask == AttentionMask::Causal ? "causal" : mask == AttentionMask::Bidirectional ? "bidirectional" : "prefix";
}

std::string describe(const AttentionContract& g) {
  return std::string(maskName(g.mask)) + " Tq=" + std::to_string(g.queries) + " Tk=" + std::to_string(g.keys) +
         " window=" + std::to_string(g.window) + " prefix=" + std::to_string(g.prefixLen) + " Hq=" +
         std::to_string(g.queryHeads) + " Hkv=" + std::to_string(g.kvHeads);
}

// Random key_valid with some padded keys, and one batch row entirely padded.
std::vector<uint8_t> randomKeyValid(const AttentionContract& g, uint32_t seed) {
  std::mt19937 generator(seed);
  std::vector<uint8_t> valid(g.batch * g.keys);
  for (uint8_t& v : valid) v = generator() % 4 != 0;
  if (g.batch > 1)
    for (int64_t key = 0; key < g.keys; ++key) valid[(g.batch - 1) * g.keys + key] = 0;
  return valid;
}

// Every mask mode with and without windows, padded keys, GQA, Tq < Tk.
std::vector<Case> cases() {
  std::vector<Case> all;
  uint32_t seed = 11;
  auto add = [&](AttentionContract g) { all.push_back({g, randomKeyValid(g, seed++)}); };
  for (int64_t window : {0, 1, 3, 7})
    for (auto [queries, keys] : {std::pair<int64_t, int64_t>{9, 9}, {5, 13}, {1, 40}}) {
      add(geometry(3, queries, keys, 4, 2, 8, 6, AttentionMask::Causal, window, 0, 0.35));
      add(geometry(2, queries, keys, 2, 2, 5, 7, AttentionMask::Prefix, window, std::min<int64_t>(keys, 6), 0.5));
      add(geometry(2, queries, keys, 3, 1, 4, 4, AttentionMask::Prefix, window, 0, 0.5));
    }
  for (auto [queries, keys] : {std::pair<int64_t, int64_t>{9, 9}, {5, 13}, {12, 4}})
    add(geometry(3, queries, keys, 4, 1, 8, 8, AttentionMask::Bidirectional, 0, 0, 0.25));
  add(geometry(2, 37, 70, 8, 2, 16, 12, AttentionMask::Causal, 20, 0, 0.25));
  add(geometry(2, 33, 70, 4, 4, 16, 16, AttentionMask::Prefix, 10, 40, 0.25));
  return all;
}

std::vector<float> runCpuAttention(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v) {
  const AttentionContract& g = c.g;
  KernelCall call("attention", {{"mask", maskName(g.mask)}, {"window", g.window}, {"prefix_len", g.prefixLen}, {"scale", g.scale}});
  call.input(DType::F32, {g.batch, g.queries, g.queryHeads, g.headDim}, q);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.headDim}, k);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.valueDim}, v);
  call.input(DType::U8, {g.batch, g.keys}, c.keyValid);
  call.output(DType::F32, {g.batch, g.queries, g.queryHeads, g.valueDim});
  call.run();
  return call.result<float>();
}

struct Gradients {
  std::vector<float> dq, dk, dv;
};

Gradients runCpuAttentionBackward(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, const std::vector<float>& dOut) {
  const AttentionContract& g = c.g;
  KernelCall call("attention_backward",
                  {{"mask", maskName(g.mask)}, {"window", g.window}, {"prefix_len", g.prefixLen}, {"scale", g.scale}});
  call.input(DType::F32, {g.batch, g.queries, g.queryHeads, g.headDim}, q);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.headDim}, k);
  call.input(DType::F32, {g.batch, g.keys, g.kvHeads, g.valueDim}, v);
  call.input(DType::U8, {g.batch, g.keys}, c.keyValid);
  call.input(DType::F32, {g.batch, g.queries, g.queryHeads, g.valueDim}, dOut);
  call.output(DType::F32, {g.batch, g.queries, g.queryHeads, g.headDim});
  call.output(DType::F32, {g.batch, g.keys, g.kvHeads, g.headDim});
  call.output(DType::F32, {g.batch, g.keys, g.kvHeads, g.valueDim});
  call.run();
  return {call.result<float>(0), call.result<float>(1), call.result<float>(2)};
}

// The CPU kernel's visible key sets, observed: with q = 0 every visible key has the same score, so
// with v one-hot in the key (Dv = Tk) o[b, i, h, j] = 1 / count when key j is visible, 0 otherwise.
std::vector<uint8_t> cpuVisibility(const Case& c) {
  Case probe = c;
  probe.g.headDim = 1;
  probe.g.valueDim = probe.g.keys;
  const AttentionContract& g = probe.g;
  std::vector<float> q(g.batch * g.queries * g.queryHeads, 0.0f), k(g.batch * g.keys * g.kvHeads, 1.0f);
  std::vector<float> v(g.batch * g.keys * g.kvHeads * g.keys, 0.0f);
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t key = 0; key < g.keys; ++key)
      for (int64_t h = 0; h < g.kvHeads; ++h) v[attention::keyRowOf(g, b, key, h) * g.keys + key] = 1.0f;
  const std::vector<float> o = runCpuAttention(probe, q, k, v);
  std::vector<uint8_t> visible(o.size());
  for (size_t e = 0; e < o.size(); ++e) visible[e] = o[e] > 0.0f;
  return visible;
}

TEST(AttentionMath, VisibilityEqualsTheCpuKernelsForEveryQueryAndKey) {
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    const std::vector<uint8_t> cpu = cpuVisibility(c);
    int64_t visibleCount = 0;
    for (int64_t b = 0; b < g.batch; ++b)
      for (int64_t i = 0; i < g.queries; ++i)
        for (int64_t h = 0; h < g.queryHeads; ++h) {
          const KeyRange range = attention::candidateKeys(g, i);
          for (int64_t j = 0; j < g.keys; ++j) {
            const bool expected = cpu[attention::queryRowOf(g, b, i, h) * g.keys + j] != 0;
            const bool visible = attention::keyVisible(g, c.keyValid[b * g.keys + j] != 0, i, j);
            ASSERT_EQ(visible, expected) << describe(g) << ": b " << b << " query " << i << " key " << j;
            if (visible) {
              ++visibleCount;
              ASSERT_TRUE(j >= range.begin && j < range.end) << describe(g) << ": key " << j << " of query " << i
                                                             << " outside its candidate range";
            }
          }
          if (i > 0) {  // candidateKeysOfQueries relies on both ends never decreasing
            EXPECT_GE(range.begin, attention::candidateKeys(g, i - 1).begin) << describe(g);
            EXPECT_GE(range.end, attention::candidateKeys(g, i - 1).end) << describe(g);
          }
        }
    EXPECT_GT(visibleCount, 0) << describe(g);
  }
}

float hostDot(const float* a, const float* b, int64_t length) {
  float sum = 0.0f;
  for (int64_t c = 0; c < length; ++c) sum += a[c] * b[c];
  return sum;
}

// attentionForwardKernel's phases for one (b, head, query tile), in its order.
std::vector<float> emulateForward(const Case& c, TileShape tiles, const std::vector<float>& q,
                                  const std::vector<float>& k, const std::vector<float>& v) {
  const AttentionContract& g = c.g;
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const float scale = static_cast<float>(g.scale);
  std::vector<float> o(g.batch * g.queries * g.queryHeads * dv, std::nanf(""));
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t head = 0; head < g.queryHeads; ++head)
      for (int64_t q0 = 0; q0 < g.queries; q0 += br) {
        const int rows = static_cast<int>(std::min<int64_t>(br, g.queries - q0));
        const int64_t kvHead = attention::kvHeadOf(g, head);
        std::vector<OnlineSoftmax> state(br);
        std::vector<float> acc(br * dv, 0.0f), scores(br * bc), factor(br);
        const KeyRange range = attention::candidateKeysOfQueries(g, q0, q0 + rows - 1);
        for (int64_t k0 = range.begin; k0 < range.end; k0 += bc) {
          const int keysHere = static_cast<int>(std::min<int64_t>(bc, range.end - k0));
          for (int i = 0; i < br; ++i)
            for (int j = 0; j < bc; ++j) {
              float score = -INFINITY;
              if (i < rows && j < keysHere &&
                  attention::keyVisible(g, c.keyValid[b * g.keys + k0 + j] != 0, q0 + i, k0 + j))
                score = scale * hostDot(&q[attention::queryRowOf(g, b, q0 + i, head) * d],
                                        &k[attention::keyRowOf(g, b, k0 + j, kvHead) * d], d);
              scores[i * bc + j] = score;
            }
          for (int i = 0; i < rows; ++i) factor[i] = attention::takeInTile(state[i], &scores[i * bc], keysHere);
          for (int i = 0; i < rows; ++i)
            for (int64_t col = 0; col < dv; ++col) {
              float value = acc[i * dv + col] * factor[i];
              for (int j = 0; j < keysHere; ++j)
                value += scores[i * bc + j] * v[attention::keyRowOf(g, b, k0 + j, kvHead) * dv + col];
              acc[i * dv + col] = value;
            }
        }
        for (int i = 0; i < rows; ++i)
          for (int64_t col = 0; col < dv; ++col)
            o[attention::queryRowOf(g, b, q0 + i, head) * dv + col] =
                attention::normalizedOutput(acc[i * dv + col], state[i].sum);
      }
  return o;
}

// The backward kernels' phases: the query kernel's two passes (statistics and delta, then dq) and
// the key kernel's walk over the query tiles of the KV head's query heads (dk, dv).
Gradients emulateBackward(const Case& c, TileShape tiles, const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, const std::vector<float>& dOut) {
  const AttentionContract& g = c.g;
  const int br = tiles.queryTile, bc = tiles.keyTile;
  const int64_t d = g.headDim, dv = g.valueDim;
  const float scale = static_cast<float>(g.scale);
  const int64_t queryRows = g.batch * g.queries * g.queryHeads;
  std::vector<float> maximum(queryRows), sum(queryRows), delta(queryRows);
  Gradients out{std::vector<float>(queryRows * d, std::nanf("")),
                std::vector<float>(g.batch * g.keys * g.kvHeads * d, std::nanf("")),
                std::vector<float>(g.batch * g.keys * g.kvHeads * dv, std::nanf(""))};
  auto visible = [&](int64_t b, int64_t query, int64_t key) {
    return attention::keyVisible(g, c.keyValid[b * g.keys + key] != 0, query, key);
  };
  auto score = [&](int64_t b, int64_t query, int64_t head, int64_t key) {
    return scale * hostDot(&q[attention::queryRowOf(g, b, query, head) * d],
                           &k[attention::keyRowOf(g, b, key, attention::kvHeadOf(g, head)) * d], d);
  };
  auto dp = [&](int64_t b, int64_t query, int64_t head, int64_t key) {
    return hostDot(&dOut[attention::queryRowOf(g, b, query, head) * dv],
                   &v[attention::keyRowOf(g, b, key, attention::kvHeadOf(g, head)) * dv], dv);
  };
  // The query kernel.
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t head = 0; head < g.queryHeads; ++head)
      for (int64_t q0 = 0; q0 < g.queries; q0 += br) {
        const int rows = static_cast<int>(std::min<int64_t>(br, g.queries - q0));
        const KeyRange range = attention::candidateKeysOfQueries(g, q0, q0 + rows - 1);
        std::vector<OnlineSoftmax> state(br);
        std::vector<float> weightedDp(br, 0.0f), scores(bc), dps(bc), dqAcc(br * d, 0.0f);
        for (int64_t k0 = range.begin; k0 < range.end; k0 += bc) {
          const int keysHere = static_cast<int>(std::min<int64_t>(bc, range.end - k0));
          for (int i = 0; i < rows; ++i) {
            for (int j = 0; j < keysHere; ++j) {
              const bool seen = visible(b, q0 + i, k0 + j);
              scores[j] = seen ? score(b, q0 + i, head, k0 + j) : -INFINITY;
              dps[j] = seen ? dp(b, q0 + i, head, k0 + j) : 0.0f;
            }
            attention::takeInTileWithDp(state[i], weightedDp[i], scores.data(), dps.data(), keysHere);
          }
        }
        for (int i = 0; i < rows; ++i) {
          const int64_t row = attention::queryRowOf(g, b, q0 + i, head);
          maximum[row] = state[i].maximum;
          sum[row] = state[i].sum;
          delta[row] = attention::normalizedOutput(weightedDp[i], state[i].sum);
        }
        for (int64_t k0 = range.begin; k0 < range.end; k0 += bc) {
          const int keysHere = static_cast<int>(std::min<int64_t>(bc, range.end - k0));
          std::vector<float> ds(br * bc, 0.0f);
          for (int i = 0; i < rows; ++i)
            for (int j = 0; j < keysHere; ++j) {
              const int64_t row = attention::queryRowOf(g, b, q0 + i, head);
              if (visible(b, q0 + i, k0 + j))
                ds[i * bc + j] = attention::scoreGradient(
                    scale, attention::probability(score(b, q0 + i, head, k0 + j), maximum[row], sum[row]),
                    dp(b, q0 + i, head, k0 + j), delta[row]);
            }
          for (int i = 0; i < rows; ++i)
            for (int64_t col = 0; col < d; ++col) {
              float value = dqAcc[i * d + col];
              for (int j = 0; j < keysHere; ++j)
                value += ds[i * bc + j] * k[attention::keyRowOf(g, b, k0 + j, attention::kvHeadOf(g, head)) * d + col];
              dqAcc[i * d + col] = value;
            }
        }
        for (int i = 0; i < rows; ++i)
          std::copy_n(&dqAcc[i * d], d, &out.dq[attention::queryRowOf(g, b, q0 + i, head) * d]);
      }
  // The key kernel.
  const int64_t headsPerKv = g.queryHeads / g.kvHeads;
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t kvHead = 0; kvHead < g.kvHeads; ++kvHead)
      for (int64_t k0 = 0; k0 < g.keys; k0 += bc) {
        const int keysHere = static_cast<int>(std::min<int64_t>(bc, g.keys - k0));
        std::vector<float> dkAcc(bc * d, 0.0f), dvAcc(bc * dv, 0.0f);
        for (int64_t head = kvHead * headsPerKv; head < (kvHead + 1) * headsPerKv; ++head)
          for (int64_t q0 = 0; q0 < g.queries; q0 += br) {
            const int rows = static_cast<int>(std::min<int64_t>(br, g.queries - q0));
            const KeyRange range = attention::candidateKeysOfQueries(g, q0, q0 + rows - 1);
            if (range.end <= k0 || range.begin >= k0 + keysHere) continue;
            std::vector<float> p(br * bc, 0.0f), ds(br * bc, 0.0f);
            for (int i = 0; i < rows; ++i)
              for (int j = 0; j < keysHere; ++j) {
                if (!visible(b, q0 + i, k0 + j)) continue;
                const int64_t row = attention::queryRowOf(g, b, q0 + i, head);
                p[i * bc + j] = attention::probability(score(b, q0 + i, head, k0 + j), maximum[row], sum[row]);
                ds[i * bc + j] = attention::scoreGradient(scale, p[i * bc + j], dp(b, q0 + i, head, k0 + j), delta[row]);
              }
            for (int j = 0; j < keysHere; ++j) {
              for (int64_t col = 0; col < dv; ++col) {
                float value = dvAcc[j * dv + col];
                for (int i = 0; i < rows; ++i)
                  value += p[i * bc + j] * dOut[attention::queryRowOf(g, b, q0 + i, head) * dv + col];
                dvAcc[j * dv + col] = value;
              }
              for (int64_t col = 0; col < d; ++col) {
                float value = dkAcc[j * d + col];
                for (int i = 0; i < rows; ++i)
                  value += ds[i * bc + j] * q[attention::queryRowOf(g, b, q0 + i, head) * d + col];
                dkAcc[j * d + col] = value;
              }
            }
          }
        for (int j = 0; j < keysHere; ++j) {
          std::copy_n(&dkAcc[j * d], d, &out.dk[attention::keyRowOf(g, b, k0 + j, kvHead) * d]);
          std::copy_n(&dvAcc[j * dv], dv, &out.dv[attention::keyRowOf(g, b, k0 + j, kvHead) * dv]);
        }
      }
  return out;
}

// |emulated − cpu| ≤ tolerance · max(1, |cpu|), and no NaN (an element the emulation never wrote).
void expectMatches(const std::vector<float>& emulated, const std::vector<float>& cpu, double tolerance,
                   const std::string& what) {
  ASSERT_EQ(emulated.size(), cpu.size()) << what;
  
  for (size_t e = 0; e < cpu.size(); ++e) {
    ASSERT_FALSE(std::isnan(emulated[e])) << what << ": element " << e << " not written";
    const double error = std::fabs(static_cast<double>(emulated[e]) - cpu[e]) / std::max(1.0, std::fabs(static_cast<double>(cpu[e])));
    ASSERT_LE(error, tolerance) << what << ": element " << e << ": emulated " << emulated[e] << ", cpu " << cpu[e];
  }
}

// The tile shapes the CUDA kernels pick for head dims 8..256 and small odd ones that leave partial
// tiles everywhere.
std::vector<TileShape> tileShapes(const AttentionContract& g) {
  return {attention::chooseTiles(g.headDim, g.valueDim, 96 * 1024,
                                 [](TileShape t, int64_t d, int64_t dv) { return attention::forwardSharedFloats(t, d, dv); }),
          TileShape{3, 5}, TileShape{1, 1}, TileShape{4, 32}};
}

TEST(AttentionMath, TiledForwardEmulationMatchesTheCpuKernel) {
  uint32_t seed = 500;
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    const auto q = randomValues<float>(g.batch * g.queries * g.queryHeads * g.headDim, seed++);
    const auto k = randomValues<float>(g.batch * g.keys * g.kvHeads * g.headDim, seed++);
    const auto v = randomValues<float>(g.batch * g.keys * g.kvHeads * g.valueDim, seed++);
    const std::vector<float> cpu = runCpuAttention(c, q, k, v);
    for (TileShape tiles : tileShapes(g))
      expectMatches(emulateForward(c, tiles, q, k, v), cpu, 1e-6,
                    describe(g) + " tiles " + std::to_string(tiles.queryTile) + "x" + std::to_string(tiles.keyTile));
  }
}

TEST(AttentionMath, TiledBackwardEmulationMatchesTheCpuKernel) {
  uint32_t seed = 900;
  for (const Case& c : cases()) {
    const AttentionContract& g = c.g;
    const auto q = randomValues<float>(g.batch * g.queries * g.queryHeads * g.headDim, seed++);
    const auto k = randomValues<float>(g.batch * g.keys * g.kvHeads * g.headDim, seed++);
    const auto v = randomValues<float>(g.batch * g.keys * g.kvHeads * g.valueDim, seed++);
    const auto dOut = randomValues<float>(g.batch * g.queries * g.queryHeads * g.valueDim, seed++);
    const Gradients cpu = runCpuAttentionBackward(c, q, k, v, dOut);
    for (TileShape tiles : tileShapes(g)) {
      const Gradients emulated = emulateBackward(c, tiles, q, k, v, dOut);
      const std::string what =
          describe(g) + " tiles " + std::to_string(tiles.queryTile) + "x" + std::to_string(tiles.keyTile);
      expectMatches(emulated.dq, cpu.dq, 2e-6, "dq " + what);
      expectMatches(emulated.dk, cpu.dk, 2e-6, "dk " + what);
      expectMatches(emulated.dv, cpu.dv, 2e-6, "dv " + what);
    }
  }
}

TEST(AttentionMath, RowWithoutVisibleKeysStaysZero) {
  OnlineSoftmax row;
  float scores[3] = {-INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ(attention::takeInTile(row, scores, 3), 1.0f);
  EXPECT_EQ(row.sum, 0.0f);
  for (float weight : scores) EXPECT_EQ(weight, 0.0f);
  EXPECT_EQ(attention::normalizedOutput(0.0f, row.sum), 0.0f);
  // The first visible key: nothing accumulated before it survives (factor 0), its weight is 1.
  float next[2] = {-INFINITY, 2.5f};
  EXPECT_EQ(attention::takeInTile(row, next, 2), 0.0f);
  EXPECT_EQ(row.maximum, 2.5f);
  EXPECT_EQ(next[1], 1.0f);
  EXPECT_EQ(row.sum, 1.0f);
}

TEST(AttentionMath, TilesFitTheSharedMemoryBudget) {
  using SharedFloats = int64_t (*)(TileShape, int64_t, int64_t);
  const SharedFloats kernels[] = {
      [](TileShape t, int64_t d, int64_t dv) { return attention::forwardSharedFloats(t, d, dv); },
      [](TileShape t, int64_t d, int64_t dv) { return attention::backwardQuerySharedFloats(t, d, dv); },
      [](TileShape t, int64_t d, int64_t dv) { return attention::backwardKeySharedFloats(t, d, dv); }};
  const int64_t budget = 96 * 1024;
  for (SharedFloats shared : kernels) {
    EXPECT_EQ(attention::chooseTiles(8, 8, budget, shared).queryTile, 16);
    EXPECT_EQ(attention::chooseTiles(8, 8, budget, shared).keyTile, 32);
    for (int64_t dim : {1, 64, 128, 256, 512}) {
      const TileShape t = attention::chooseTiles(dim, dim, budget, shared);
      ASSERT_GT(t.queryTile, 0) << dim;
      EXPECT_LE(shared(t, dim, dim) * 4, budget) << dim;
    }
    EXPECT_EQ(attention::chooseTiles(1 << 14, 1 << 14, budget, shared).queryTile, 0);  // not even 1 x 1
  }
}

}  // namespace
}  // namespace dgemma::test
