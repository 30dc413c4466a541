// attention: per query row, softmax(scale · q·kᵀ) over the keys its mask lets it see, times v. Grouped
// query heads (GQA) read a shared KV head, and the masks are structural (causal with an optional
// window and an optional image overlay of segment ids, bidirectional, prefix) rather than a
// materialised [Tq, Tk] matrix.
// attention_backward: the gradients dq, dk, dv for an output gradient do, recomputing the
// probabilities with the same visibility rules.
//
// Both work on query tiles: 16 or 32 queries of one (b, head) against the keys any of them may see
// (AttentionMath.h's candidateKeysOfQueries), with the products as BLAS GEMMs read straight from the
// strided tensors (a query head's rows lie Hq·D apart, a KV head's Hkv·D apart) and the per-row
// softmax between them. An invisible key inside the tile's key range takes part in the products with
// probability 0. Every product is a single-threaded OpenBLAS call inside one pool task, and the
// tiling does not depend on the pool, so the results are the same bytes for every thread count.
#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/attention/AttentionMath.h"
#include "runtime/kernels/attention/Contract.h"
#include "runtime/kernels/matmul/BlasThreading.h"
#include "runtime/kernels/matmul/CpuGemm.h"

namespace dgemma {
namespace {

// Queries per tile, chosen from the contract alone (never from the pool). Under the causal mask each
// query's keys move with it and a tile's key range is the union of its queries' ranges: 16-query
// tiles with a window of 64 compute about 79 keys per row for 64 visible ones, 32-query tiles 95.
// Under the bidirectional and prefix masks every query has the same range, so larger tiles only make
// longer GEMMs. At the small-20m shapes (bench/cpu_kernels_bench.cpp) 16 was the faster under the
// causal mask and 32 under the prefix mask, each by roughly 10-30%.
constexpr int64_t kLargestQueryTile = 32;
// A windowed bidirectional mask moves each query's keys with it, as the causal mask does.
int64_t queryTileOf(const AttentionContract& g) {
  const bool keysMoveWithTheQuery =
      g.mask == AttentionMask::Causal || (g.mask == AttentionMask::Bidirectional && g.window > 0);
  return keysMoveWithTheQuery ? 16 : kLargestQueryTile;
}

// The scores q·k are summed over head_dim in chunks of this many products, each chunk one GEMM
// added to the last. A GEMM sums each element in one sequential chain: over D = 64 in f32 that made
// the forward's error half as large again as the lane-parallel dot products this kernel had before
// (root mean square, against a double reference), and pushed one generation parity metric past its
// bound (test/integration/GenerationParityTest.cpp, hf_tester's entropy, 1.1e-5 > 1e-5). Chains of
// 32 bring the error back to the dot products' level and that metric to 7.4e-6.
constexpr int64_t kScoreChunk = 32;

// The tensors of one attention call (the backward kernel's gradients stay null in the forward).
template <typename T>
struct AttentionTensors {
  const T* q;
  const T* k;
  const T* v;
  const uint8_t* keyValid;  // u8 and bool are both one byte, nonzero = valid
  const int64_t* segmentIds;   // null: no image overlay
  const int64_t* documentIds;  // null: one document
  const T* dOut;
  T* out;  // o in the forward, dq in the backward
  T* dk;
  T* dv;
};

// Queries [first, first + rows) of (b, head) and the keys [keys.begin, keys.end) any of them may see.
struct QueryTile {
  int64_t b, head, first, rows;
  attention::KeyRange keys;
  int64_t keyCount() const { return keys.end - keys.begin; }
};

int64_t tilesPerHead(const AttentionContract& g) { return (g.queries + queryTileOf(g) - 1) / queryTileOf(g); }

QueryTile queryTile(const AttentionContract& g, int64_t b, int64_t head, int64_t tile) {
  const int64_t first = tile * queryTileOf(g), rows = std::min(queryTileOf(g), g.queries - first);
  return {b, head, first, rows, attention::candidateKeysOfQueries(g, first, first + rows - 1)};
}

// Per-task scratch, sized once per parallel chunk: the tile's probabilities and (backward) score
// gradients, [query tile, Tk] at most, and which rows see a key.
template <typename T>
struct TileScratch {
  explicit TileScratch(const AttentionContract& g, bool backward)
      : probabilities(kLargestQueryTile * g.keys),
        scoreGradients(backward ? kLargestQueryTile * g.keys : 0),
        rowSeesKeys(kLargestQueryTile) {}
  std::vector<T> probabilities, scoreGradients;
  std::vector<uint8_t> rowSeesKeys;
};

// The tile's probabilities into scratch.probabilities ([rows, keyCount], row-major): the scores
// q·kᵀ as GEMMs (one per kScoreChunk of head_dim), then per row softmax(scale · score) over the
// visible keys and 0 at the invisible ones; a row without a visible key is all 0 and marked in
// scratch.rowSeesKeys. The forward's output weights and the backward's recomputed ones are this one
// function. Always inlined, so that the f32 clones below compile it (the exps) for their target.
template <typename T>
[[gnu::always_inline]] inline void tileProbabilities(const AttentionContract& g, const AttentionTensors<T>& t,
                                                     const QueryTile& tile, TileScratch<T>& scratch) {
  const int64_t keyCount = tile.keyCount(), kvHead = attention::kvHeadOf(g, tile.head);
  T* const probabilities = scratch.probabilities.data();
  const T* const q = t.q + attention::queryRowOf(g, tile.b, tile.first, tile.head) * g.headDim;
  const T* const k = t.k + attention::keyRowOf(g, tile.b, tile.keys.begin, kvHead) * g.headDim;
  int64_t chunk = 0;
  do {  // at least one product, which writes the zero scores of D = 0
    cpu::gemm(false, true, tile.rows, keyCount, std::min(kScoreChunk, g.headDim - chunk), q + chunk,
              g.queryHeads * g.headDim, k + chunk, g.kvHeads * g.headDim, probabilities, keyCount, T(chunk == 0 ? 0 : 1));
    chunk += kScoreChunk;
  } while (chunk < g.headDim);

  const T scale = static_cast<T>(g.scale), minusInfinity = -std::numeric_limits<T>::infinity();
  const uint8_t* valid = t.keyValid + tile.b * g.keys + tile.keys.begin;
  const attention::MaskRows maskRows = attention::maskRowsOf(g, t.segmentIds, t.documentIds, tile.b);
  for (int64_t r = 0; r < tile.rows; ++r) {
    const int64_t query = tile.first + r;
    T* const row = probabilities + r * keyCount;
    // An invisible key's score becomes −inf (whatever its product held, NaN included), which each
    // loop below can test for without a second array. Keys outside the query's own candidates are
    // invisible; only those inside go through the predicate, whose branches then rarely change.
    const attention::KeyRange candidates = attention::candidateKeys(g, query);
    const int64_t candidatesBegin = candidates.begin - tile.keys.begin;
    const int64_t candidatesEnd = candidates.end - tile.keys.begin;
    std::fill(row, row + candidatesBegin, minusInfinity);
    bool seesKeys = false;
    for (int64_t j = candidatesBegin; j < candidatesEnd; ++j) {
      const bool visible = attention::keyVisible(g, valid[j] != 0, maskRows, query, tile.keys.begin + j);
      row[j] = visible ? scale * row[j] : minusInfinity;
      seesKeys |= visible;
    }
    std::fill(row + candidatesEnd, row + keyCount, minusInfinity);
    scratch.rowSeesKeys[r] = seesKeys;
    if (!seesKeys) {  // no visible key: the row stays zero instead of 0/0
      std::fill_n(row, keyCount, T(0));
      continue;
    }
    const T maximum = cpu::laneMaximum(row, keyCount);
    // exp of every score times 0 or 1 (visible), rather than a branch, so that the loop vectorises.
    for (int64_t j = 0; j < keyCount; ++j)
      row[j] = static_cast<T>(row[j] != minusInfinity) * cpu::fastExp(row[j] - maximum);
    const T sum = cpu::laneSum(row, keyCount);
    for (int64_t j = 0; j < keyCount; ++j) row[j] /= sum;
  }
}

// Zeroes the rows of `tile` (of width `width`, `stride` apart from `rows`) that see no key: their
// products were 0 · (whatever the keys hold), and the contract says zeros.
template <typename T>
void zeroRowsWithoutKeys(const QueryTile& tile, const TileScratch<T>& scratch, T* rows, int64_t stride, int64_t width) {
  for (int64_t r = 0; r < tile.rows; ++r)
    if (!scratch.rowSeesKeys[r]) std::fill_n(rows + r * stride, width, T(0));
}

// Forward tasks [begin, end), one per (b, head, query tile), the tile index fastest: o_tile = P · v_range.
// T is also the accumulator type (scores, softmax sum, output), as the contract says.
template <typename T>
[[gnu::always_inline]] inline void attentionTasks(const AttentionContract& g, const AttentionTensors<T>& t,
                                                  int64_t begin, int64_t end) {
  TileScratch<T> scratch(g, false);
  const int64_t tiles = tilesPerHead(g);
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / (g.queryHeads * tiles), head = task / tiles % g.queryHeads;
    const QueryTile tile = queryTile(g, b, head, task % tiles);
    T* const out = t.out + attention::queryRowOf(g, b, tile.first, head) * g.valueDim;
    const int64_t outStride = g.queryHeads * g.valueDim;
    tileProbabilities(g, t, tile, scratch);
    cpu::gemm(false, false, tile.rows, g.valueDim, tile.keyCount(), scratch.probabilities.data(), tile.keyCount(),
              t.v + attention::keyRowOf(g, b, tile.keys.begin, attention::kvHeadOf(g, head)) * g.valueDim,
              g.kvHeads * g.valueDim, out, outStride);
    zeroRowsWithoutKeys(tile, scratch, out, outStride, g.valueDim);
  }
}

// With p = softmax(s) over the visible keys and s = scale · q·k, per query tile:
//   dp = do · v_rangeᵀ,   delta = Σ_j p dp,   ds = scale · p ∘ (dp − delta),
//   dq = ds · k_range,   dk_range += dsᵀ · q,   dv_range += pᵀ · do.
// Tasks [begin, end) of the backward, one per (batch, KV head): each owns that head's dk and dv rows,
// so the sums over the grouped query heads and the query tiles need no locks and run in one order,
// whatever the thread count.
template <typename T>
[[gnu::always_inline]] inline void attentionBackwardTasks(const AttentionContract& g, const AttentionTensors<T>& t,
                                                          int64_t begin, int64_t end) {
  TileScratch<T> scratch(g, true);
  const T scale = static_cast<T>(g.scale);
  const int64_t headsPerKv = g.queryHeads / g.kvHeads, tiles = tilesPerHead(g);
  const int64_t queryStride = g.queryHeads * g.headDim, outStride = g.queryHeads * g.valueDim;
  const int64_t keyStride = g.kvHeads * g.headDim, valueStride = g.kvHeads * g.valueDim;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / g.kvHeads, kvHead = task % g.kvHeads;
    for (int64_t key = 0; key < g.keys; ++key) {
      std::fill_n(t.dk + attention::keyRowOf(g, b, key, kvHead) * g.headDim, g.headDim, T(0));
      std::fill_n(t.dv + attention::keyRowOf(g, b, key, kvHead) * g.valueDim, g.valueDim, T(0));
    }
    for (int64_t head = kvHead * headsPerKv; head < (kvHead + 1) * headsPerKv; ++head)
      for (int64_t tileIndex = 0; tileIndex < tiles; ++tileIndex) {
        const QueryTile tile = queryTile(g, b, head, tileIndex);
        const int64_t keyCount = tile.keyCount(), firstRow = attention::queryRowOf(g, b, tile.first, head);
        const int64_t firstKeyRow = attention::keyRowOf(g, b, tile.keys.begin, kvHead);
        const T* const q = t.q + firstRow * g.headDim;
        const T* const dOut = t.dOut + firstRow * g.valueDim;
        const T* const k = t.k + firstKeyRow * g.headDim;
        const T* const v = t.v + firstKeyRow * g.valueDim;
        T* const dq = t.out + firstRow * g.headDim;
        const T* const probabilities = scratch.probabilities.data();
        T* const scoreGradients = scratch.scoreGradients.data();

        tileProbabilities(g, t, tile, scratch);
        cpu::gemm(false, true, tile.rows, keyCount, g.valueDim, dOut, outStride, v, valueStride, scoreGradients,
                  keyCount);
        for (int64_t r = 0; r < tile.rows; ++r) {
          const T* const p = probabilities + r * keyCount;
          T* const dp = scoreGradients + r * keyCount;  // dp in, ds out
          T delta = 0;
          for (int64_t j = 0; j < keyCount; ++j) delta += p[j] * dp[j];
          for (int64_t j = 0; j < keyCount; ++j) dp[j] = scale * p[j] * (dp[j] - delta);
        }
        cpu::gemm(false, false, tile.rows, g.headDim, keyCount, scoreGradients, keyCount, k, keyStride, dq,
                  queryStride);
        zeroRowsWithoutKeys(tile, scratch, dq, queryStride, g.headDim);
        cpu::gemm(true, false, keyCount, g.headDim, tile.rows, scoreGradients, keyCount, q, queryStride,
                  t.dk + firstKeyRow * g.headDim, keyStride, T(1));
        cpu::gemm(true, false, keyCount, g.valueDim, tile.rows, probabilities, keyCount, dOut, outStride,
                  t.dv + firstKeyRow * g.valueDim, valueStride, T(1));
      }
  }
}

// The f32 instances in AVX2 clones (see FastMath.h): the exps and the row loops between the GEMMs
// double their SIMD width.
DGEMMA_CPU_CLONES_FOR_AVX2 void attentionTasksF32(const AttentionContract& g, const AttentionTensors<float>& t,
                                                  int64_t begin, int64_t end) {
  attentionTasks(g, t, begin, end);
}
DGEMMA_CPU_CLONES_FOR_AVX2 void attentionBackwardTasksF32(const AttentionContract& g,
                                                          const AttentionTensors<float>& t, int64_t begin,
                                                          int64_t end) {
  attentionBackwardTasks(g, t, begin, end);
}

template <typename T>
class AttentionKernel final : public Kernel {
 public:
  explicit AttentionKernel(AttentionContract geometry) : geometry_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t* segmentIds = geometry_.segmented ? inputs[geometry_.segmentInput].as<const int64_t>() : nullptr;
    const int64_t* documentIds = geometry_.documented ? inputs[geometry_.documentInput].as<const int64_t>() : nullptr;
    const AttentionTensors<T> tensors{inputs[0].as<const T>(),
                                      inputs[1].as<const T>(),
                                      inputs[2].as<const T>(),
                                      inputs[3].as<const uint8_t>(),
                                      segmentIds,
                                      documentIds,
                                      nullptr,
                                      outputs[0].as<T>(),
                                      nullptr,
                                      nullptr};
    const AttentionContract& g = geometry_;
    // One OpenBLAS thread per product: the tiles run side by side on the pool instead.
    const SingleThreadedProducts singleThreaded;
    cpu::parallelFor(context, g.batch * g.queryHeads * tilesPerHead(g), 1, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float>)
        attentionTasksF32(g, tensors, begin, end);
      else
        attentionTasks(g, tensors, begin, end);
    });
  }

 private:
  AttentionContract geometry_;
};

std::unique_ptr<Kernel> createAttentionKernel(const KernelSignature& signature) {
  const AttentionContract c = parseAttentionContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<AttentionKernel<double>>(c);
  return std::make_unique<AttentionKernel<float>>(c);
}

template <typename T>
class AttentionBackwardKernel final : public Kernel {
 public:
  explicit AttentionBackwardKernel(AttentionContract geometry) : geometry_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t* segmentIds = geometry_.segmented ? inputs[geometry_.segmentInput].as<const int64_t>() : nullptr;
    const int64_t* documentIds = geometry_.documented ? inputs[geometry_.documentInput].as<const int64_t>() : nullptr;
    const AttentionTensors<T> tensors{inputs[0].as<const T>(),
                                      inputs[1].as<const T>(),
                                      inputs[2].as<const T>(),
                                      inputs[3].as<const uint8_t>(),
                                      segmentIds,
                                      documentIds,
                                      inputs[4].as<const T>(),
                                      outputs[0].as<T>(),
                                      outputs[1].as<T>(),
                                      outputs[2].as<T>()};
    const AttentionContract& g = geometry_;
    // One OpenBLAS thread per product: the (b, KV head) tasks run side by side on the pool instead.
    const SingleThreadedProducts singleThreaded;
    cpu::parallelFor(context, g.batch * g.kvHeads, 1, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float>)
        attentionBackwardTasksF32(g, tensors, begin, end);
      else
        attentionBackwardTasks(g, tensors, begin, end);
    });
  }

 private:
  AttentionContract geometry_;
};

std::unique_ptr<Kernel> createAttentionBackwardKernel(const KernelSignature& signature) {
  const AttentionContract c = parseAttentionBackwardContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<AttentionBackwardKernel<double>>(c);
  return std::make_unique<AttentionBackwardKernel<float>>(c);
}

}  // namespace

void registerAttentionCpuKernels(KernelRegistry& registry) {
  registry.add("attention", createAttentionKernel);
  registry.add("attention_backward", createAttentionBackwardKernel);
}

}  // namespace dgemma
