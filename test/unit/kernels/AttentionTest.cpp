// attention against a reference that materialises the [B, Tq, Tk] mask from the contract's
// visibility formulas and takes the softmax in double: every mask, windows, padding, GQA, K = V,
// Dv != D, empty rows, the causal mask's image overlay (segment ids), packed documents (document
// ids) under every mask, the bidirectional mask's symmetric window, and the factory's checks.
// attention_backward against the same reference's gradients where the CPU kernel's query tiles
// split the rows, and both kernels' bytes across pool sizes.
#include <cmath>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

struct AttentionCase {
  int64_t batch = 2, queries = 6, keys = 6, queryHeads = 2, kvHeads = 1, headDim = 8, valueDim = 8;
  std::string mask = "causal";
  int64_t window = 0;
  int64_t prefixLen = 0;
  double scale = 1.0;
  int64_t trailingKeys = 0;  // keys after the last query's position; 0: no trailing_keys attribute
  std::vector<uint8_t> keyValid;  // [batch, keys]; empty: every key valid
  std::vector<int64_t> segmentIds;  // [batch, keys]; empty: no segment_ids input
  std::vector<int64_t> documentIds;  // [batch, keys]; empty: no document_ids input
};

std::vector<uint8_t> keyValidOf(const AttentionCase& c) {
  return c.keyValid.empty() ? std::vector<uint8_t>(c.batch * c.keys, 1) : c.keyValid;
}

// docs/kernels.md's visibility of key j for query i, written out literally; `segments` and
// `documents` are the batch row's segment and document ids or null.
bool visible(const AttentionCase& c, const uint8_t* valid, const int64_t* segments, const int64_t* documents, int64_t i,
             int64_t j) {
  const int64_t position = c.keys - c.queries - c.trailingKeys + i;  // the query's own key position
  if (documents != nullptr && documents[j] != documents[position]) return false;
  const bool keyValid = valid[j] != 0;
  if (c.mask == "causal") {
    const bool causal = j <= position && (c.window == 0 || position - j < c.window);
    const bool sameImage = segments != nullptr && segments[position] > 0 && segments[position] == segments[j];
    return (keyValid && (causal || sameImage)) || j == position;
  }
  if (c.mask == "bidirectional") return keyValid && (c.window == 0 || std::abs(position - j) < c.window);
  return j >= c.prefixLen || (keyValid && (c.window == 0 || j >= c.prefixLen - c.window));
}

// mask[b][i][j]: whether query i of batch row b sees key j.
std::vector<std::vector<std::vector<bool>>> materialisedMask(const AttentionCase& c) {
  const std::vector<uint8_t> valid = keyValidOf(c);
  std::vector<std::vector<std::vector<bool>>> mask(c.batch, std::vector<std::vector<bool>>(c.queries, std::vector<bool>(c.keys)));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.queries; ++i)
      for (int64_t j = 0; j < c.keys; ++j)
        mask[b][i][j] =
            visible(c, valid.data() + b * c.keys, c.segmentIds.empty() ? nullptr : c.segmentIds.data() + b * c.keys,
                    c.documentIds.empty() ? nullptr : c.documentIds.data() + b * c.keys, i, j);
  return mask;
}

// The keys that query i of batch row b sees under `mask` and their softmax probabilities for query
// head h, in f64 (the references below share it).
struct VisibleRow {
  std::vector<int64_t> keys;
  std::vector<double> probabilities;
};

template <typename T>
VisibleRow visibleRow(const AttentionCase& c, const std::vector<std::vector<std::vector<bool>>>& mask,
                      const std::vector<T>& q, const std::vector<T>& k, int64_t b, int64_t i, int64_t h) {
  const int64_t kvHead = h / (c.queryHeads / c.kvHeads);
  const int64_t qBase = ((b * c.queries + i) * c.queryHeads + h) * c.headDim;
  VisibleRow row;
  std::vector<double> scores;
  for (int64_t j = 0; j < c.keys; ++j) {
    if (!mask[b][i][j]) continue;
    const int64_t kBase = ((b * c.keys + j) * c.kvHeads + kvHead) * c.headDim;
    double dot = 0;
    for (int64_t d = 0; d < c.headDim; ++d) dot += static_cast<double>(q[qBase + d]) * k[kBase + d];
    row.keys.push_back(j);
    scores.push_back(c.scale * dot);
  }
  if (row.keys.empty()) return row;
  const double maximum = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (double score : scores) sum += std::exp(score - maximum);
  for (double score : scores) row.probabilities.push_back(std::exp(score - maximum) / sum);
  return row;
}

template <typename T>
std::vector<double> attentionReference(const AttentionCase& c, const std::vector<T>& q, const std::vector<T>& k,
                                       const std::vector<T>& v) {
  const auto mask = materialisedMask(c);
  std::vector<double> o(c.batch * c.queries * c.queryHeads * c.valueDim, 0.0);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.queries; ++i)
      for (int64_t h = 0; h < c.queryHeads; ++h) {
        const int64_t kvHead = h / (c.queryHeads / c.kvHeads);
        const VisibleRow row = visibleRow(c, mask, q, k, b, i, h);
        const int64_t oBase = ((b * c.queries + i) * c.queryHeads + h) * c.valueDim;
        for (size_t n = 0; n < row.keys.size(); ++n) {
          const int64_t vBase = ((b * c.keys + row.keys[n]) * c.kvHeads + kvHead) * c.valueDim;
          for (int64_t d = 0; d < c.valueDim; ++d) o[oBase + d] += row.probabilities[n] * v[vBase + d];
        }
      }
  return o;
}

// The step attributes of the case; trailing_keys only when set, as DgToPlan writes it.
nlohmann::json attributesOf(const AttentionCase& c) {
  nlohmann::json attrs = {{"mask", c.mask},
                          {"window", c.window},
                          {"prefix_len", c.prefixLen},
                          {"scale", c.scale},
                          {"has_document_ids", !c.documentIds.empty()}};
  if (c.trailingKeys != 0) attrs["trailing_keys"] = c.trailingKeys;
  return attrs;
}

template <typename T>
std::vector<T> runAttention(DType dtype, const AttentionCase& c, const std::vector<T>& q, const std::vector<T>& k,
                            const std::vector<T>& v, DType keyValidType = DType::U8, ThreadPool* threads = nullptr) {
  KernelCall call("attention", attributesOf(c));
  call.input(dtype, {c.batch, c.queries, c.queryHeads, c.headDim}, q);
  call.input(dtype, {c.batch, c.keys, c.kvHeads, c.headDim}, k);
  call.input(dtype, {c.batch, c.keys, c.kvHeads, c.valueDim}, v);
  call.input(keyValidType, {c.batch, c.keys}, keyValidOf(c));
  if (!c.segmentIds.empty()) call.input(DType::I64, {c.batch, c.keys}, c.segmentIds);
  if (!c.documentIds.empty()) call.input(DType::I64, {c.batch, c.keys}, c.documentIds);
  call.output(dtype, {c.batch, c.queries, c.queryHeads, c.valueDim});
  call.run(threads);
  return call.result<T>();
}

struct AttentionInputs {
  std::vector<double> q, k, v;
};

AttentionInputs randomInputs(const AttentionCase& c, uint32_t seed) {
  return {randomValues<double>(c.batch * c.queries * c.queryHeads * c.headDim, seed, -1, 1),
          randomValues<double>(c.batch * c.keys * c.kvHeads * c.headDim, seed + 1, -1, 1),
          randomValues<double>(c.batch * c.keys * c.kvHeads * c.valueDim, seed + 2, -1, 1)};
}

template <typename T>
std::vector<T> as(const std::vector<double>& values) {
  return std::vector<T>(values.begin(), values.end());
}

// Runs the case in f64 and f32 against the double reference of the same (rounded) inputs.
void checkAttention(const AttentionCase& c, uint32_t seed, DType keyValidType = DType::U8,
                    ThreadPool* threads = nullptr) {
  const AttentionInputs inputs = randomInputs(c, seed);
  expectClose(runAttention(DType::F64, c, inputs.q, inputs.k, inputs.v, keyValidType, threads),
              attentionReference(c, inputs.q, inputs.k, inputs.v), 1e-12);
  const std::vector<float> q = as<float>(inputs.q), k = as<float>(inputs.k), v = as<float>(inputs.v);
  expectClose(runAttention(DType::F32, c, q, k, v, keyValidType, threads), attentionReference(c, q, k, v), 1e-5);
}

// Batch row 1 is left-padded by `pads` keys.
std::vector<uint8_t> leftPadded(int64_t keys, int64_t pads) {
  std::vector<uint8_t> valid(2 * keys, 1);
  std::fill(valid.begin() + keys, valid.begin() + keys + pads, 0);
  return valid;
}

TEST(AttentionKernel, CausalWithPaddedKeysAndBoolKeyValid) {
  checkAttention({.keyValid = leftPadded(6, 2)}, 71);
  checkAttention({.keyValid = leftPadded(6, 2)}, 72, DType::Bool);
}

TEST(AttentionKernel, CausalWindowShorterThanTheSequence) {
  checkAttention({.queries = 7, .keys = 7, .window = 3, .keyValid = leftPadded(7, 1)}, 73);
  checkAttention({.queries = 5, .keys = 5, .window = 1}, 74);  // only the diagonal
}

TEST(AttentionKernel, CausalQueriesAreTheLastPositions) {
  checkAttention({.queries = 3, .keys = 8}, 75);
  checkAttention({.queries = 3, .keys = 8, .window = 4, .keyValid = leftPadded(8, 5)}, 76);
}

TEST(AttentionKernel, PadQueryKeepsOnlyItsDiagonal) {
  // Batch row 1's first two keys are padding: its queries 0 and 1 see just themselves, so their
  // outputs are their own value rows exactly.
  const AttentionCase c{.batch = 2, .queries = 4, .keys = 4, .queryHeads = 1, .kvHeads = 1, .headDim = 4,
                        .valueDim = 4, .keyValid = leftPadded(4, 2)};
  const AttentionInputs inputs = randomInputs(c, 77);
  const std::vector<double> o = runAttention(DType::F64, c, inputs.q, inputs.k, inputs.v);
  for (int64_t pad = 0; pad < 2; ++pad)
    for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(o[(4 + pad) * 4 + d], inputs.v[(4 + pad) * 4 + d]);
  expectClose(o, attentionReference(c, inputs.q, inputs.k, inputs.v), 1e-12);
}

TEST(AttentionKernel, BidirectionalSkipsPaddedKeys) {
  checkAttention({.queries = 5, .keys = 7, .mask = "bidirectional", .keyValid = leftPadded(7, 3)}, 78);
  checkAttention({.mask = "bidirectional", .keyValid = leftPadded(6, 2)}, 79, DType::Bool);
}

TEST(AttentionKernel, PrefixWindowTruncatesThePrefixAndSkipsItsPadding) {
  // 6 prefix slots then 3 canvas keys. Window 3 keeps prefix slots 3..5; row 1 pads slot 4 (inside
  // the window), slot 1 (outside it anyway) and canvas key 7, which stays visible.
  std::vector<uint8_t> valid(18, 1);
  valid[9 + 1] = valid[9 + 4] = valid[9 + 7] = 0;
  checkAttention({.queries = 3, .keys = 9, .mask = "prefix", .window = 3, .prefixLen = 6, .keyValid = valid}, 80);
  checkAttention({.queries = 3, .keys = 9, .mask = "prefix", .prefixLen = 6, .keyValid = valid}, 81);
  // A window longer than the prefix keeps all of it.
  checkAttention({.queries = 2, .keys = 5, .mask = "prefix", .window = 10, .prefixLen = 3}, 82);
}

TEST(AttentionKernel, ARowWithNoVisibleKeyIsZero) {
  // Row 1 is all padding: the prefix (everything, prefix_len = Tk) and bidirectional masks leave it
  // with no key at all.
  std::vector<uint8_t> valid(8, 1);
  std::fill(valid.begin() + 4, valid.end(), 0);
  for (const std::string mask : {"prefix", "bidirectional"}) {
    SCOPED_TRACE(mask);
    const AttentionCase c{.batch = 2, .queries = 3, .keys = 4, .mask = mask, .prefixLen = mask == "prefix" ? 4 : 0,
                          .keyValid = valid};
    const AttentionInputs inputs = randomInputs(c, 83);
    const std::vector<double> o = runAttention(DType::F64, c, inputs.q, inputs.k, inputs.v);
    const size_t rowOneStart = o.size() / 2;
    for (size_t index = rowOneStart; index < o.size(); ++index) ASSERT_EQ(o[index], 0.0) << "flat index " << index;
    expectClose(o, attentionReference(c, inputs.q, inputs.k, inputs.v), 1e-12);
    const std::vector<float> o32 = runAttention(DType::F32, c, as<float>(inputs.q), as<float>(inputs.k),
                                                as<float>(inputs.v));
    for (size_t index = rowOneStart; index < o32.size(); ++index) ASSERT_EQ(o32[index], 0.0f);
  }
}

TEST(AttentionKernel, GroupedQueryHeadsReadTheirKvHead) {
  checkAttention({.queryHeads = 4, .kvHeads = 2, .keyValid = leftPadded(6, 1)}, 84);
  checkAttention({.queries = 4, .keys = 6, .queryHeads = 8, .kvHeads = 2, .window = 3}, 85);
  checkAttention({.queryHeads = 4, .kvHeads = 1, .mask = "bidirectional"}, 86);
}

TEST(AttentionKernel, ValueDimDiffersFromHeadDimAndScaleApplies) {
  checkAttention({.headDim = 6, .valueDim = 3, .scale = 0.5, .keyValid = leftPadded(6, 2)}, 87);
  checkAttention({.queries = 2, .keys = 5, .kvHeads = 2, .headDim = 4, .valueDim = 10, .mask = "prefix",
                  .window = 2, .prefixLen = 3, .scale = 2.0},
                 88);
}

TEST(AttentionKernel, ManyRowsAcrossThreads) {
  ThreadPool threads(2);
  checkAttention({.batch = 2, .queries = 40, .keys = 64, .queryHeads = 4, .kvHeads = 2, .headDim = 16,
                  .valueDim = 16, .window = 24, .keyValid = leftPadded(64, 9)},
                 89, DType::U8, &threads);
}

// Segment ids as the encoder's image overlay: batch row 0 holds image 1 at positions 2..6 and image 2
// at 9..10; row 1 is left-padded by 3 (pad queries 0..2, the first two inside image 1) and holds
// image 1 at 1..4 and image 2 at 8..11.
std::vector<int64_t> imageSegments() {
  return {0, 0, 1, 1, 1, 1, 1, 0, 0, 2, 2, 0,  //
          0, 1, 1, 1, 1, 0, 0, 0, 2, 2, 2, 2};
}

TEST(AttentionKernel, CausalSegmentsSeeTheirWholeImage) {
  // Window 3 is shorter than both images: their queries reach keys outside the window and in the future.
  checkAttention({.queries = 12, .keys = 12, .window = 3, .keyValid = leftPadded(12, 3), .segmentIds = imageSegments()}, 91);
  checkAttention({.queries = 12, .keys = 12, .keyValid = leftPadded(12, 3), .segmentIds = imageSegments()}, 92,
                 DType::Bool);
  // The queries are the last 5 positions: query 0 sits at key position 7.
  checkAttention({.queries = 5, .keys = 12, .queryHeads = 4, .kvHeads = 2, .window = 2, .keyValid = leftPadded(12, 3),
                  .segmentIds = imageSegments()},
                 93);
}

TEST(AttentionKernel, SegmentOverlayOutputsByHand) {
  // Window 1 leaves every query its diagonal alone; segments {1, 1, 0, 2}: queries 0 and 1 average
  // the values of keys 0 and 1 (q = 0: equal scores), queries 2 and 3 copy their own value. Batch
  // row 1 pads key 1: query 0 sees key 0 alone, pad query 1 keeps its diagonal and sees key 0.
  const AttentionCase c{.batch = 2, .queries = 4, .keys = 4, .queryHeads = 1, .kvHeads = 1, .headDim = 2,
                        .valueDim = 3, .window = 1, .keyValid = {1, 1, 1, 1, 1, 0, 1, 1},
                        .segmentIds = {1, 1, 0, 2, 1, 1, 0, 2}};
  const std::vector<double> q(2 * 4 * 2, 0.0), k = randomValues<double>(2 * 4 * 2, 94, -1, 1);
  const std::vector<double> v = randomValues<double>(2 * 4 * 3, 95, -1, 1);
  const std::vector<double> o = runAttention(DType::F64, c, q, k, v);
  auto value = [&](int64_t b, int64_t key, int64_t d) { return v[(b * 4 + key) * 3 + d]; };
  for (int64_t d = 0; d < 3; ++d) {
    for (int64_t query : {0, 1}) EXPECT_DOUBLE_EQ(o[query * 3 + d], (value(0, 0, d) + value(0, 1, d)) / 2);
    for (int64_t query : {2, 3}) EXPECT_DOUBLE_EQ(o[query * 3 + d], value(0, query, d));
    EXPECT_DOUBLE_EQ(o[(4 + 0) * 3 + d], value(1, 0, d));
    EXPECT_DOUBLE_EQ(o[(4 + 1) * 3 + d], (value(1, 0, d) + value(1, 1, d)) / 2);
  }
}

// Segment ids that are all 0 overlay nothing: the output equals the op without them, bit for bit.
TEST(AttentionKernel, ZeroSegmentIdsEqualNoSegmentIds) {
  AttentionCase c{.queries = 9, .keys = 12, .queryHeads = 4, .kvHeads = 2, .window = 4, .keyValid = leftPadded(12, 3)};
  const AttentionInputs inputs = randomInputs(c, 96);
  const std::vector<float> q = as<float>(inputs.q), k = as<float>(inputs.k), v = as<float>(inputs.v);
  const std::vector<float> plain = runAttention(DType::F32, c, q, k, v);
  c.segmentIds.assign(2 * 12, 0);
  EXPECT_EQ(runAttention(DType::F32, c, q, k, v), plain);
}

TEST(AttentionKernel, SegmentsAcrossThreads) {
  ThreadPool threads(2);
  std::vector<int64_t> segments(2 * 64, 0);
  for (int64_t key = 10; key < 40; ++key) segments[key] = segments[64 + key + 5] = 1 + key / 20;
  checkAttention({.batch = 2, .queries = 40, .keys = 64, .queryHeads = 4, .kvHeads = 2, .headDim = 16,
                  .valueDim = 16, .window = 8, .keyValid = leftPadded(64, 9), .segmentIds = segments},
                 97, DType::U8, &threads);
}

// K = V on Gemma 4's full layers: one buffer passed as both inputs. KernelCall gives every input its
// own memory, so this test builds the call by hand.
TEST(AttentionKernel, KeysAndValuesMayBeTheSameBuffer) {
  const AttentionCase c{.queries = 3, .keys = 5, .queryHeads = 4, .kvHeads = 2, .headDim = 6, .valueDim = 6,
                        .keyValid = leftPadded(5, 1)};
  const AttentionInputs inputs = randomInputs(c, 90);
  std::vector<double> q = inputs.q, keyValue = inputs.k;
  std::vector<uint8_t> valid = keyValidOf(c);
  std::vector<double> o(c.batch * c.queries * c.queryHeads * c.valueDim);
  auto buffer = [](DType dtype, std::vector<int64_t> shape) {
    Buffer result;
    result.dtype = dtype;
    result.shape = std::move(shape);
    return result;
  };
  const Buffer qBuffer = buffer(DType::F64, {c.batch, c.queries, c.queryHeads, c.headDim});
  const Buffer kvBuffer = buffer(DType::F64, {c.batch, c.keys, c.kvHeads, c.headDim});
  const Buffer validBuffer = buffer(DType::U8, {c.batch, c.keys});
  const Buffer oBuffer = buffer(DType::F64, {c.batch, c.queries, c.queryHeads, c.valueDim});
  Step step;
  step.op = "attention";
  step.attrs = {{"mask", "causal"}, {"window", 0}, {"prefix_len", 0}, {"scale", 1.0}};
  KernelSignature signature;
  signature.step = &step;
  signature.inputs = {&qBuffer, &kvBuffer, &kvBuffer, &validBuffer};
  signature.outputs = {&oBuffer};
  signature.where = "step 0 (attention)";
  const std::unique_ptr<Kernel> kernel = (*cpuKernels().find("attention"))(signature);
  ExecContext context;
  kernel->run(context,
              {{q.data(), &qBuffer}, {keyValue.data(), &kvBuffer}, {keyValue.data(), &kvBuffer},
               {valid.data(), &validBuffer}},
              {{o.data(), &oBuffer}});
  expectClose(o, attentionReference(c, inputs.q, inputs.k, inputs.k), 1e-12);
}

// The gradients of attentionReference for output gradient `dOut`, per query row from the same
// materialised mask: dv_j += p_j do, ds_j = scale p_j (do·v_j − Σ p do·v), dq += ds_j k_j, dk_j += ds_j q.
struct Gradients {
  std::vector<double> dq, dk, dv;
};

template <typename T>
Gradients attentionBackwardReference(const AttentionCase& c, const std::vector<T>& q, const std::vector<T>& k,
                                     const std::vector<T>& v, const std::vector<T>& dOut) {
  const auto mask = materialisedMask(c);
  Gradients g{std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
              std::vector<double>(v.size(), 0.0)};
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.queries; ++i)
      for (int64_t h = 0; h < c.queryHeads; ++h) {
        const int64_t kvHead = h / (c.queryHeads / c.kvHeads);
        const int64_t row = (b * c.queries + i) * c.queryHeads + h;
        auto keyRow = [&](int64_t j) { return (b * c.keys + j) * c.kvHeads + kvHead; };
        const VisibleRow visibleKeys = visibleRow(c, mask, q, k, b, i, h);
        const std::vector<int64_t>& keys = visibleKeys.keys;
        const std::vector<double>& p = visibleKeys.probabilities;
        std::vector<double> dp(keys.size());
        double delta = 0;
        for (size_t n = 0; n < keys.size(); ++n) {
          for (int64_t d = 0; d < c.valueDim; ++d)
            dp[n] += static_cast<double>(dOut[row * c.valueDim + d]) * v[keyRow(keys[n]) * c.valueDim + d];
          delta += p[n] * dp[n];
        }
        for (size_t n = 0; n < keys.size(); ++n) {
          const double dScore = c.scale * p[n] * (dp[n] - delta);
          for (int64_t d = 0; d < c.headDim; ++d) {
            g.dq[row * c.headDim + d] += dScore * k[keyRow(keys[n]) * c.headDim + d];
            g.dk[keyRow(keys[n]) * c.headDim + d] += dScore * q[row * c.headDim + d];
          }
          for (int64_t d = 0; d < c.valueDim; ++d)
            g.dv[keyRow(keys[n]) * c.valueDim + d] += p[n] * dOut[row * c.valueDim + d];
        }
      }
  return g;
}

// dq, dk, dv of attention_backward.
template <typename T>
std::vector<std::vector<T>> runAttentionBackward(DType dtype, const AttentionCase& c, const std::vector<T>& q,
                                                 const std::vector<T>& k, const std::vector<T>& v,
                                                 const std::vector<T>& dOut, ThreadPool* threads = nullptr) {
  KernelCall call("attention_backward", attributesOf(c));
  const std::vector<int64_t> qShape{c.batch, c.queries, c.queryHeads, c.headDim};
  const std::vector<int64_t> kShape{c.batch, c.keys, c.kvHeads, c.headDim}, vShape{c.batch, c.keys, c.kvHeads, c.valueDim};
  call.input(dtype, qShape, q).input(dtype, kShape, k).input(dtype, vShape, v);
  call.input(DType::U8, {c.batch, c.keys}, keyValidOf(c));
  call.input(dtype, {c.batch, c.queries, c.queryHeads, c.valueDim}, dOut);
  if (!c.segmentIds.empty()) call.input(DType::I64, {c.batch, c.keys}, c.segmentIds);
  if (!c.documentIds.empty()) call.input(DType::I64, {c.batch, c.keys}, c.documentIds);
  call.output(dtype, qShape).output(dtype, kShape).output(dtype, vShape);
  call.run(threads);
  return {call.result<T>(0), call.result<T>(1), call.result<T>(2)};
}

std::vector<double> randomOutputGradient(const AttentionCase& c, uint32_t seed) {
  return randomValues<double>(c.batch * c.queries * c.queryHeads * c.valueDim, seed, -1, 1);
}

// The forward and the backward in f64 and f32 against the double references of the same inputs;
// f32 within the contract's o 1e-5 and dq, dk, dv 2e-5 of max(1, |x|).
void checkForwardAndBackward(const AttentionCase& c, uint32_t seed) {
  checkAttention(c, seed);
  const AttentionInputs inputs = randomInputs(c, seed);
  const std::vector<double> dOut = randomOutputGradient(c, seed + 3);
  const Gradients reference = attentionBackwardReference(c, inputs.q, inputs.k, inputs.v, dOut);
  const auto exact = runAttentionBackward(DType::F64, c, inputs.q, inputs.k, inputs.v, dOut);
  expectClose(exact[0], reference.dq, 1e-12);
  expectClose(exact[1], reference.dk, 1e-12);
  expectClose(exact[2], reference.dv, 1e-12);
  const std::vector<float> q = as<float>(inputs.q), k = as<float>(inputs.k), v = as<float>(inputs.v);
  const std::vector<float> dOut32 = as<float>(dOut);
  const Gradients reference32 = attentionBackwardReference(c, q, k, v, dOut32);
  const auto rounded = runAttentionBackward(DType::F32, c, q, k, v, dOut32);
  expectClose(rounded[0], reference32.dq, 2e-5);
  expectClose(rounded[1], reference32.dk, 2e-5);
  expectClose(rounded[2], reference32.dv, 2e-5);
}

// The CPU kernels work on tiles of 16 (causal) or 32 queries against the union of their key ranges.
// Tq = 45 and 37 leave a short last tile, and every case puts a tile boundary where it matters.
TEST(AttentionKernel, QueryTilesMatchTheRowReference) {
  {
    SCOPED_TRACE("causal, window 20 across the tile boundaries, pad queries in the first tile");
    // The queries are positions 25..69; batch row 1 pads keys 0..29, so its queries 0..4 (positions
    // 25..29) keep only their diagonal and query 5 sees position 30 alone.
    checkForwardAndBackward({.batch = 2, .queries = 45, .keys = 70, .queryHeads = 4, .kvHeads = 2, .headDim = 16,
                             .valueDim = 12, .window = 20, .scale = 0.25, .keyValid = leftPadded(70, 30)},
                            101);
  }
  {
    SCOPED_TRACE("causal with segment ids across a tile boundary");
    // Queries are positions 13..49; tile 1 starts at query 16 = position 29, inside image 1 (20..35)
    // of batch row 0 and image 1 (27..31) of batch row 1. Window 4: the images reach far past it.
    std::vector<int64_t> segments(2 * 50, 0);
    for (int64_t position = 20; position < 36; ++position) segments[position] = 1;
    for (int64_t position = 40; position < 48; ++position) segments[position] = 2;
    for (int64_t position = 27; position < 32; ++position) segments[50 + position] = 1;
    checkForwardAndBackward({.batch = 2, .queries = 37, .keys = 50, .queryHeads = 4, .kvHeads = 2, .headDim = 16,
                             .valueDim = 16, .window = 4, .scale = 0.25, .keyValid = leftPadded(50, 6),
                             .segmentIds = segments},
                            102);
  }
  // Batch row 1 is all padding: under the prefix mask with prefix_len = Tk and the bidirectional mask
  // its rows see no key, in both tiles; their outputs and gradients are zero.
  std::vector<uint8_t> valid(2 * 53, 1);
  std::fill(valid.begin() + 53, valid.end(), 0);
  for (const std::string mask : {"prefix", "bidirectional"}) {
    SCOPED_TRACE(mask + ", a batch row without visible keys");
    const AttentionCase c{.batch = 2, .queries = 37, .keys = 53, .queryHeads = 4, .kvHeads = 2, .headDim = 8,
                          .valueDim = 8, .mask = mask, .prefixLen = mask == "prefix" ? 53 : 0, .scale = 0.5,
                          .keyValid = valid};
    checkForwardAndBackward(c, 103);
    const AttentionInputs inputs = randomInputs(c, 103);
    const std::vector<float> o = runAttention(DType::F32, c, as<float>(inputs.q), as<float>(inputs.k), as<float>(inputs.v));
    for (size_t index = o.size() / 2; index < o.size(); ++index) ASSERT_EQ(o[index], 0.0f) << "o at " << index;
    const auto gradients = runAttentionBackward(DType::F32, c, as<float>(inputs.q), as<float>(inputs.k),
                                                as<float>(inputs.v), as<float>(randomOutputGradient(c, 104)));
    for (const std::vector<float>& gradient : gradients)
      for (size_t index = gradient.size() / 2; index < gradient.size(); ++index)
        ASSERT_EQ(gradient[index], 0.0f) << "gradient at " << index;
  }
  SCOPED_TRACE("prefix with a window, padded prefix slots");
  checkForwardAndBackward({.batch = 2, .queries = 37, .keys = 53, .queryHeads = 2, .kvHeads = 1, .headDim = 8,
                           .valueDim = 8, .mask = "prefix", .window = 10, .prefixLen = 16, .keyValid = leftPadded(53, 9)},
                          105);
}

// Packed documents as the pre-training data writes them: batch row 0 holds documents of 5, 9, 4 and
// 6 positions, row 1 of 11 and 13, the last 3 positions padding of a third document.
std::vector<int64_t> packedDocuments() {
  std::vector<int64_t> documents;
  for (auto [document, length] : {std::pair<int64_t, int64_t>{0, 5}, {1, 9}, {2, 4}, {3, 6}, {0, 11}, {1, 13}})
    documents.insert(documents.end(), length, document);
  return documents;
}

std::vector<uint8_t> rightPadded(int64_t keys, int64_t padding) {
  std::vector<uint8_t> valid(2 * keys, 1);
  std::fill(valid.end() - padding, valid.end(), 0);
  return valid;
}

TEST(AttentionKernel, DocumentsKeepPackedSequencesApart) {
  // Window 3 (causal) and the symmetric window 3 (bidirectional) are shorter than most documents,
  // unlimited ones reach across every boundary but for the documents.
  for (int64_t window : {0, 3}) {
    SCOPED_TRACE("window " + std::to_string(window));
    checkForwardAndBackward({.queries = 24,
                             .keys = 24,
                             .queryHeads = 4,
                             .kvHeads = 2,
                             .window = window,
                             .keyValid = rightPadded(24, 3),
                             .documentIds = packedDocuments()},
                            120 + window);
    checkForwardAndBackward({.queries = 24,
                             .keys = 24,
                             .queryHeads = 4,
                             .kvHeads = 2,
                             .mask = "bidirectional",
                             .window = window,
                             .keyValid = rightPadded(24, 3),
                             .documentIds = packedDocuments()},
                            130 + window);
    // The queries are the last 10 positions: query 0 sits at key position 14, in document 2 of row 0.
    checkForwardAndBackward({.queries = 10,
                             .keys = 24,
                             .mask = "bidirectional",
                             .window = window,
                             .keyValid = rightPadded(24, 3),
                             .documentIds = packedDocuments()},
                            140 + window);
    checkForwardAndBackward({.queries = 10,
                             .keys = 24,
                             .mask = "prefix",
                             .window = window,
                             .prefixLen = 8,
                             .keyValid = rightPadded(24, 3),
                             .documentIds = packedDocuments()},
                            150 + window);
  }
  // With the image overlay: an image segment that straddles a document boundary sees only its own
  // document's part.
  std::vector<int64_t> segments(2 * 24, 0);
  for (int64_t position = 3; position < 8; ++position) segments[position] = segments[24 + position + 8] = 1;
  checkForwardAndBackward({.queries = 24,
                           .keys = 24,
                           .window = 2,
                           .keyValid = rightPadded(24, 3),
                           .segmentIds = segments,
                           .documentIds = packedDocuments()},
                          160);
}

TEST(AttentionKernel, DocumentOutputsByHand) {
  // q = 0 gives every visible key the same score. Bidirectional over documents {0, 0, 1, 1, 1}:
  // queries 0 and 1 average keys 0 and 1, queries 2..4 keys 2..4; with the symmetric window 2,
  // query 3 averages keys 2..4 and query 2 keys 2 and 3.
  AttentionCase c{.batch = 1,
                  .queries = 5,
                  .keys = 5,
                  .queryHeads = 1,
                  .kvHeads = 1,
                  .headDim = 2,
                  .valueDim = 3,
                  .mask = "bidirectional",
                  .documentIds = {0, 0, 1, 1, 1}};
  const std::vector<double> q(5 * 2, 0.0), k = randomValues<double>(5 * 2, 161, -1, 1);
  const std::vector<double> v = randomValues<double>(5 * 3, 162, -1, 1);
  auto mean = [&](int64_t first, int64_t last, int64_t d) {
    double sum = 0;
    for (int64_t key = first; key <= last; ++key) sum += v[key * 3 + d];
    return sum / static_cast<double>(last - first + 1);
  };
  std::vector<double> o = runAttention(DType::F64, c, q, k, v);
  for (int64_t d = 0; d < 3; ++d) {
    for (int64_t query : {0, 1}) EXPECT_DOUBLE_EQ(o[query * 3 + d], mean(0, 1, d));
    for (int64_t query : {2, 3, 4}) EXPECT_DOUBLE_EQ(o[query * 3 + d], mean(2, 4, d));
  }
  c.window = 2;
  o = runAttention(DType::F64, c, q, k, v);
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_DOUBLE_EQ(o[1 * 3 + d], mean(0, 1, d));  // key 2 is within the window but in document 1
    EXPECT_DOUBLE_EQ(o[2 * 3 + d], mean(2, 3, d));
    EXPECT_DOUBLE_EQ(o[3 * 3 + d], mean(2, 4, d));
    EXPECT_DOUBLE_EQ(o[4 * 3 + d], mean(3, 4, d));
  }
}

// Document ids that are all equal keep nothing apart: the output equals the op without them, bit for bit.
TEST(AttentionKernel, OneDocumentEqualsNoDocumentIds) {
  for (const std::string mask : {"causal", "bidirectional"}) {
    AttentionCase c{.queries = 9,
                    .keys = 12,
                    .queryHeads = 4,
                    .kvHeads = 2,
                    .mask = mask,
                    .window = 4,
                    .keyValid = leftPadded(12, 3)};
    const AttentionInputs inputs = randomInputs(c, 163);
    const std::vector<float> q = as<float>(inputs.q), k = as<float>(inputs.k), v = as<float>(inputs.v);
    const std::vector<float> plain = runAttention(DType::F32, c, q, k, v);
    c.documentIds.assign(2 * 12, 7);
    EXPECT_EQ(runAttention(DType::F32, c, q, k, v), plain) << mask;
  }
}

// Zero-size dimensions, which the contract admits: the GEMMs get no elements, or none to sum
// (D = 0: every score 0; Tk = 0: every row without keys).
TEST(AttentionKernel, ZeroSizeDimensions) {
  checkForwardAndBackward({.queries = 3, .keys = 5, .headDim = 0, .valueDim = 4, .keyValid = leftPadded(5, 1)}, 108);
  checkForwardAndBackward({.queries = 3, .keys = 5, .headDim = 4, .valueDim = 0, .mask = "prefix", .prefixLen = 2}, 109);
  checkForwardAndBackward({.queries = 2, .keys = 0, .mask = "bidirectional"}, 110);
  checkForwardAndBackward({.queries = 0, .keys = 4}, 111);
}

// Every product is a single-threaded BLAS call inside one pool task and the tiling ignores the pool:
// no pool and pools of 1, 2 and 3 threads give the same bytes.
TEST(AttentionKernel, PoolSizesGiveTheSameBytes) {
  std::vector<int64_t> segments(2 * 64, 0);
  for (int64_t key = 10; key < 40; ++key) segments[key] = segments[64 + key + 5] = 1 + key / 20;
  const std::vector<AttentionCase> cases = {
      {.batch = 2, .queries = 40, .keys = 64, .queryHeads = 4, .kvHeads = 2, .headDim = 16, .valueDim = 16,
       .window = 24, .scale = 0.25, .keyValid = leftPadded(64, 9), .segmentIds = segments},
      {.batch = 2, .queries = 45, .keys = 64, .queryHeads = 4, .kvHeads = 2, .headDim = 16, .valueDim = 16,
       .mask = "prefix", .prefixLen = 19, .scale = 0.25, .keyValid = leftPadded(64, 9)}};
  ThreadPool one(1), two(2), three(3);
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.mask);
    const AttentionInputs inputs = randomInputs(c, 106);
    const std::vector<float> q = as<float>(inputs.q), k = as<float>(inputs.k), v = as<float>(inputs.v);
    const std::vector<float> dOut = as<float>(randomOutputGradient(c, 107));
    const std::vector<float> o = runAttention(DType::F32, c, q, k, v);
    const auto gradients = runAttentionBackward(DType::F32, c, q, k, v, dOut);
    for (ThreadPool* pool : {&one, &two, &three}) {
      SCOPED_TRACE(std::to_string(pool->size()) + " threads");
      EXPECT_EQ(runAttention(DType::F32, c, q, k, v, DType::U8, pool), o);
      EXPECT_EQ(runAttentionBackward(DType::F32, c, q, k, v, dOut, pool), gradients);
    }
  }
}

KernelCall attentionCall(nlohmann::json attrs, std::vector<int64_t> qShape, std::vector<int64_t> kShape,
                         std::vector<int64_t> vShape, std::vector<int64_t> validShape, std::vector<int64_t> oShape,
                         DType validType = DType::U8) {
  auto zeros = [](const std::vector<int64_t>& shape) {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return std::vector<float>(count);
  };
  KernelCall call("attention", std::move(attrs));
  call.input(DType::F32, qShape, zeros(qShape)).input(DType::F32, kShape, zeros(kShape));
  call.input(DType::F32, vShape, zeros(vShape));
  const std::vector<float> validValues = zeros(validShape);
  if (validType == DType::F32)
    call.input(DType::F32, validShape, validValues);
  else
    call.input(validType, validShape, std::vector<uint8_t>(validValues.size()));
  call.output(DType::F32, oShape);
  return call;
}

// A context-parallel query chunk (docs/parallelism.md, "Context parallelism") runs over all the keys
// with trailing_keys placing it: against the reference, and equal to its rows of the whole sequence's
// attention (its dK and dV summed with the other chunk's give the whole one's), with the image
// overlay straddling the chunk boundary, a window, padding and documents.
TEST(AttentionKernel, TrailingKeysPlaceAQueryChunk) {
  const int64_t keys = 40, chunk = 16;
  std::vector<int64_t> segments(2 * keys, 0), documents(2 * keys, 0);
  for (int64_t position = 10; position < 22; ++position) segments[position] = 1;  // across key 16
  for (int64_t position = 28; position < 34; ++position) segments[position] = 2;
  for (int64_t position = 14; position < 19; ++position) segments[keys + position] = 1;
  for (int64_t position = 30; position < keys; ++position) documents[keys + position] = 1;
  const AttentionCase whole{.queries = keys,
                            .keys = keys,
                            .queryHeads = 4,
                            .kvHeads = 2,
                            .window = 6,
                            .keyValid = leftPadded(keys, 3),
                            .segmentIds = segments,
                            .documentIds = documents};
  const AttentionInputs inputs = randomInputs(whole, 131);
  const std::vector<double> dOut = randomOutputGradient(whole, 134);
  const auto wholeOutput = runAttention(DType::F64, whole, inputs.q, inputs.k, inputs.v);
  const auto wholeGradients = runAttentionBackward(DType::F64, whole, inputs.q, inputs.k, inputs.v, dOut);
  // Rows [first, first + count) of a [B, T, H, X] tensor of T = keys.
  auto rows = [&](const std::vector<double>& values, int64_t first, int64_t count) {
    const int64_t rowSize = static_cast<int64_t>(values.size()) / (2 * keys);
    std::vector<double> out;
    for (int64_t b = 0; b < 2; ++b)
      out.insert(out.end(), values.begin() + (b * keys + first) * rowSize,
                 values.begin() + (b * keys + first + count) * rowSize);
    return out;
  };
  std::vector<double> dkSum(wholeGradients[1].size(), 0.0), dvSum(wholeGradients[2].size(), 0.0);
  for (int64_t first : {int64_t{0}, chunk}) {
    SCOPED_TRACE("the chunk from query " + std::to_string(first));
    const int64_t count = first == 0 ? chunk : keys - chunk;
    AttentionCase part = whole;
    part.queries = count;
    part.trailingKeys = keys - first - count;
    checkForwardAndBackward(part, 131 + static_cast<uint32_t>(first));
    const std::vector<double> q = rows(inputs.q, first, count), partOut = rows(dOut, first, count);
    expectClose(runAttention(DType::F64, part, q, inputs.k, inputs.v), rows(wholeOutput, first, count), 1e-12);
    const auto gradients = runAttentionBackward(DType::F64, part, q, inputs.k, inputs.v, partOut);
    expectClose(gradients[0], rows(wholeGradients[0], first, count), 1e-12);
    for (size_t i = 0; i < dkSum.size(); ++i) dkSum[i] += gradients[1][i];
    for (size_t i = 0; i < dvSum.size(); ++i) dvSum[i] += gradients[2][i];
  }
  expectClose(dkSum, wholeGradients[1], 1e-12);
  expectClose(dvSum, wholeGradients[2], 1e-12);
}

TEST(AttentionKernel, FactoryRejectsBadSignatures) {
  // A plan's step carries every attribute; each case changes some.
  auto attrs = [](const nlohmann::json& changes) {
    nlohmann::json all = {{"mask", "causal"}, {"window", 0}, {"prefix_len", 0}, {"scale", 1.0}};
    all.update(changes);
    return all;
  };
  const nlohmann::json causal = attrs(nlohmann::json::object());
  nlohmann::json maskless = causal;
  maskless.erase("mask");
  // q [1, 2, 4, 8], k and v [1, 3, 2, 8], key_valid [1, 3], o [1, 2, 4, 8] is accepted.
  EXPECT_NO_THROW(attentionCall(causal, {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8}).create());

  EXPECT_EQ(factoryError(attentionCall(causal, {1, 2, 6, 8}, {1, 3, 4, 8}, {1, 3, 4, 8}, {1, 3}, {1, 2, 6, 8})),
            "step 0 (attention): query heads Hq=6 are not a multiple of key/value heads Hkv=4");
  EXPECT_EQ(factoryError(attentionCall(attrs({{"mask", "sliding"}}), {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3},
                                       {1, 2, 4, 8})),
            "step 0 (attention): attribute 'mask': expected causal, bidirectional or prefix, got 'sliding'");
  EXPECT_EQ(factoryError(attentionCall(maskless, {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8})),
            "step 0 (attention): attribute 'mask' is missing");
  for (int64_t prefixLen : {int64_t{-1}, int64_t{4}})
    EXPECT_EQ(factoryError(attentionCall(attrs({{"mask", "prefix"}, {"prefix_len", prefixLen}}), {1, 2, 4, 8},
                                         {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8})),
              "step 0 (attention): attribute 'prefix_len': " + std::to_string(prefixLen) + " is outside [0, Tk = 3]");
  EXPECT_EQ(factoryError(attentionCall(attrs({{"mask", "causal"}, {"prefix_len", 1}}), {1, 2, 4, 8}, {1, 3, 2, 8},
                                       {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8})),
            "step 0 (attention): attribute 'prefix_len' applies only to mask 'prefix'");
  EXPECT_EQ(factoryError(attentionCall(attrs({{"mask", "causal"}, {"window", -1}}), {1, 2, 4, 8}, {1, 3, 2, 8},
                                       {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8})),
            "step 0 (attention): attribute 'window': expected a non-negative integer, got -1");
  EXPECT_EQ(factoryError(attentionCall(attrs({{"mask", "bidirectional"}, {"window", 2}}), {1, 4, 4, 8}, {1, 3, 2, 8},
                                       {1, 3, 2, 8}, {1, 3}, {1, 4, 4, 8})),
            "step 0 (attention): mask 'bidirectional' with a window needs Tq <= Tk (the window is centred on the "
            "query's key position Tk - Tq + i), got Tq=4, Tk=3");
  EXPECT_EQ(factoryError(attentionCall(causal, {1, 4, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 4, 4, 8})),
            "step 0 (attention): mask 'causal' needs Tq <= Tk (the queries are the last Tq key positions), got "
            "Tq=4, Tk=3");

  EXPECT_EQ(factoryError(attentionCall(causal, {1, 2, 4, 8}, {1, 3, 2, 6}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8})),
            "step 0 (attention): input k has shape [1,3,2,6], expected [1,3,2,8]");
  EXPECT_EQ(factoryError(attentionCall(causal, {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 4, 2, 8}, {1, 3}, {1, 2, 4, 8})),
            "step 0 (attention): input v has shape [1,4,2,8], expected [1,3,2,8]");
  EXPECT_EQ(factoryError(attentionCall(causal, {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {3}, {1, 2, 4, 8})),
            "step 0 (attention): input key_valid has shape [3], expected [1,3]");
  EXPECT_EQ(factoryError(attentionCall(causal, {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 5}, {1, 3}, {1, 2, 4, 8})),
            "step 0 (attention): output o has shape [1,2,4,8], expected [1,2,4,5]");
  EXPECT_EQ(factoryError(attentionCall(causal, {2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8})),
            "step 0 (attention): input q has shape [2,4,8], expected [B, Tq, Hq, D]");
  EXPECT_EQ(factoryError(attentionCall(causal, {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8},
                                       DType::F32)),
            "step 0 (attention): input key_valid has dtype f32, expected u8 or bool");
  // trailing_keys: the queries' positions lie inside the keys, 0 <= trailing_keys <= Tk - Tq.
  EXPECT_NO_THROW(
      attentionCall(attrs({{"trailing_keys", 1}}), {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8})
          .create());
  for (int64_t trailing : {int64_t{-1}, int64_t{2}})
    EXPECT_EQ(
        factoryError(attentionCall(attrs({{"trailing_keys", trailing}}), {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8},
                                   {1, 3}, {1, 2, 4, 8})),
        "step 0 (attention): attribute 'trailing_keys': " + std::to_string(trailing) + " is outside [0, Tk - Tq = 1]");

  // The optional segment_ids: [B, Tk] i64, with the causal mask only.
  auto withSegments = [](KernelCall call, DType dtype, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    if (dtype == DType::I64)
      call.input(dtype, shape, std::vector<int64_t>(count));
    else
      call.input(dtype, shape, std::vector<int32_t>(count));
    return call;
  };
  auto call = [&](nlohmann::json attrs) {
    return attentionCall(std::move(attrs), {1, 2, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 2, 4, 8});
  };
  EXPECT_NO_THROW(withSegments(call(causal), DType::I64, {1, 3}).create());
  EXPECT_EQ(factoryError(withSegments(call(attrs({{"mask", "bidirectional"}})), DType::I64, {1, 3})),
            "step 0 (attention): input segment_ids applies only to mask 'causal'");
  EXPECT_EQ(factoryError(withSegments(call(causal), DType::I64, {1, 2})),
            "step 0 (attention): input segment_ids has shape [1,2], expected [1,3]");
  EXPECT_EQ(factoryError(withSegments(call(causal), DType::I32, {1, 3})),
            "step 0 (attention): input segment_ids has dtype i32, expected i64");

  // The optional document_ids: [B, Tk] i64 after segment_ids, any mask, named by the bool attribute.
  nlohmann::json documented = attrs({{"mask", "causal"}, {"has_document_ids", true}});
  EXPECT_NO_THROW(withSegments(call(documented), DType::I64, {1, 3}).create());
  EXPECT_NO_THROW(withSegments(withSegments(call(documented), DType::I64, {1, 3}), DType::I64, {1, 3}).create());
  EXPECT_NO_THROW(withSegments(call(attrs({{"mask", "bidirectional"}, {"window", 2}, {"has_document_ids", true}})),
                               DType::I64, {1, 3})
                      .create());
  EXPECT_EQ(factoryError(call(documented)),
            "step 0 (attention): with attribute 'has_document_ids' = true, expected 5 or 6 inputs, got 4");
  EXPECT_EQ(factoryError(withSegments(withSegments(call(causal), DType::I64, {1, 3}), DType::I64, {1, 3})),
            "step 0 (attention): with attribute 'has_document_ids' = false, expected 4 or 5 inputs, got 6");
  EXPECT_EQ(factoryError(withSegments(call(documented), DType::I64, {1, 2})),
            "step 0 (attention): input document_ids has shape [1,2], expected [1,3]");
  EXPECT_EQ(factoryError(withSegments(call(documented), DType::I32, {1, 3})),
            "step 0 (attention): input document_ids has dtype i32, expected i64");
  EXPECT_EQ(factoryError(withSegments(attentionCall(attrs({{"mask", "bidirectional"}, {"has_document_ids", true}}),
                                                    {1, 4, 4, 8}, {1, 3, 2, 8}, {1, 3, 2, 8}, {1, 3}, {1, 4, 4, 8}),
                                      DType::I64, {1, 3})),
            "step 0 (attention): input document_ids needs Tq <= Tk (a query's document is that of its key position "
            "Tk - Tq + i), got Tq=4, Tk=3");
}

}  // namespace
}  // namespace dgemma::test
