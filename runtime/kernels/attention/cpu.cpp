// attention: per query row, softmax(scale · q·kᵀ) over the keys its mask lets it see, times v. Grouped
// query heads (GQA) read a shared KV head, and the masks are structural (causal with an optional
// window and an optional image overlay of segment ids, bidirectional, prefix) rather than a
// materialised [Tq, Tk] matrix.
// attention_backward: the gradients dq, dk, dv for an output gradient do, recomputing the
// probabilities with the same visibility rules.
#include <cmath>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/attention/AttentionMath.h"
#include "runtime/kernels/attention/Contract.h"

namespace dgemma {
namespace {

// Writes the keys that query `query` sees, in increasing order, to `visible` and returns how many.
// `valid` is the batch row's key_valid and `segments` its segment ids. The visibility rules of
// docs/kernels.md are AttentionMath.h's, shared with the CUDA kernels.
int64_t collectVisibleKeys(const AttentionContract& geometry, const uint8_t* valid, attention::SegmentRow segments,
                           int64_t query, int64_t* visible) {
  int64_t count = 0;
  const attention::KeyRange candidates = attention::candidateKeys(geometry, query);
  for (int64_t key = candidates.begin; key < candidates.end; ++key)
    if (attention::keyVisible(geometry, valid[key] != 0, segments, query, key)) visible[count++] = key;
  return count;
}

// softmax(scale · q·k) over the `count` visible keys of one query row, into `probabilities`: the
// forward's output weights and the backward's recomputed ones are this one function. `keyRow(key)`
// points at that key's head_dim values.
template <typename T, typename KeyRow>
[[gnu::always_inline]] inline void visibleProbabilities(const AttentionContract& g, const T* qRow, const int64_t* visible, int64_t count,
                          const KeyRow& keyRow, T* probabilities) {
  const T scale = static_cast<T>(g.scale);
  T maximum = 0;
  for (int64_t n = 0; n < count; ++n) {
    probabilities[n] = scale * cpu::dotProduct(qRow, keyRow(visible[n]), g.headDim);
    maximum = n == 0 ? probabilities[n] : std::max(maximum, probabilities[n]);
  }
  T sum = 0;
  for (int64_t n = 0; n < count; ++n) sum += (probabilities[n] = cpu::fastExp(probabilities[n] - maximum));
  for (int64_t n = 0; n < count; ++n) probabilities[n] /= sum;
}

// The tensors of one attention call (the backward kernel's gradients stay null in the forward).
template <typename T>
struct AttentionTensors {
  const T* q;
  const T* k;
  const T* v;
  const uint8_t* keyValid;  // u8 and bool are both one byte, nonzero = valid
  const int64_t* segmentIds;  // null: no image overlay
  const T* dOut;
  T* out;  // o in the forward, dq in the backward
  T* dk;
  T* dv;
};

// Output rows [begin, end) of the forward. Rows are (b, query, head) in the memory order of q and o,
// so row r's vectors start at r·D and r·Dv. T is also the accumulator type (scores, softmax sum,
// output), as the contract says. Always inlined, so that the f32 clones below compile it for their
// target.
template <typename T>
[[gnu::always_inline]] inline void attentionRows(const AttentionContract& g, const AttentionTensors<T>& t,
                                                 int64_t begin, int64_t end) {
  const int64_t headsPerKv = g.queryHeads / g.kvHeads;
  std::vector<int64_t> visible(g.keys);
  std::vector<T> weights(g.keys);  // probabilities of the visible keys
  for (int64_t row = begin; row < end; ++row) {
    const int64_t head = row % g.queryHeads;
    const int64_t query = (row / g.queryHeads) % g.queries;
    const int64_t b = row / (g.queryHeads * g.queries);
    const int64_t kvHead = head / headsPerKv;
    const T* qRow = t.q + row * g.headDim;
    T* oRow = t.out + row * g.valueDim;
    std::fill(oRow, oRow + g.valueDim, T(0));
    const int64_t count = collectVisibleKeys(g, t.keyValid + b * g.keys, attention::segmentRowOf(g, t.segmentIds, b),
                                             query, visible.data());
    if (count == 0) continue;  // no visible key: the row stays zero instead of 0/0

    auto kvOffset = [&](int64_t key) { return (b * g.keys + key) * g.kvHeads + kvHead; };
    visibleProbabilities(g, qRow, visible.data(), count, [&](int64_t key) { return t.k + kvOffset(key) * g.headDim; },
                         weights.data());
    for (int64_t n = 0; n < count; ++n) {
      const T* vRow = t.v + kvOffset(visible[n]) * g.valueDim;
      for (int64_t d = 0; d < g.valueDim; ++d) oRow[d] += weights[n] * vRow[d];
    }
  }
}

// With p = softmax(s) over the visible keys and s = scale · q·k:
//   dv_j += p_j do,   dp_j = do·v_j,   ds_j = p_j (dp_j − Σ p dp),   dq += scale ds_j k_j,   dk_j += scale ds_j q.
// Tasks [begin, end) of the backward, one per (batch, KV head): each owns that head's dk and dv rows,
// so the sums over the grouped query heads and the queries need no locks, and the result does not
// depend on the thread count.
template <typename T>
[[gnu::always_inline]] inline void attentionBackwardTasks(const AttentionContract& g, const AttentionTensors<T>& t,
                                                          int64_t begin, int64_t end) {
  const int64_t headsPerKv = g.queryHeads / g.kvHeads;
  const T scale = static_cast<T>(g.scale);
  std::vector<int64_t> visible(g.keys);
  std::vector<T> probability(g.keys), dProbability(g.keys);
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / g.kvHeads, kvHead = task % g.kvHeads;
    auto kvOffset = [&](int64_t key) { return (b * g.keys + key) * g.kvHeads + kvHead; };
    for (int64_t key = 0; key < g.keys; ++key) {
      std::fill_n(t.dk + kvOffset(key) * g.headDim, g.headDim, T(0));
      std::fill_n(t.dv + kvOffset(key) * g.valueDim, g.valueDim, T(0));
    }
    for (int64_t head = kvHead * headsPerKv; head < (kvHead + 1) * headsPerKv; ++head)
      for (int64_t query = 0; query < g.queries; ++query) {
        const int64_t row = (b * g.queries + query) * g.queryHeads + head;
        const T* qRow = t.q + row * g.headDim;
        const T* dOutRow = t.dOut + row * g.valueDim;
        T* dqRow = t.out + row * g.headDim;
        std::fill_n(dqRow, g.headDim, T(0));
        const int64_t count = collectVisibleKeys(g, t.keyValid + b * g.keys,
                                                 attention::segmentRowOf(g, t.segmentIds, b), query, visible.data());
        if (count == 0) continue;  // the forward row was zero whatever q, k, v: no gradient

        visibleProbabilities(g, qRow, visible.data(), count,
                             [&](int64_t key) { return t.k + kvOffset(key) * g.headDim; }, probability.data());
        T expectedDp = 0;
        for (int64_t n = 0; n < count; ++n) {
          const T dot = cpu::dotProduct(dOutRow, t.v + kvOffset(visible[n]) * g.valueDim, g.valueDim);
          dProbability[n] = dot;
          expectedDp += probability[n] * dot;
        }
        for (int64_t n = 0; n < count; ++n) {
          const T dScore = scale * probability[n] * (dProbability[n] - expectedDp);
          const T* kRow = t.k + kvOffset(visible[n]) * g.headDim;
          T* dkRow = t.dk + kvOffset(visible[n]) * g.headDim;
          T* dvRow = t.dv + kvOffset(visible[n]) * g.valueDim;
          for (int64_t d = 0; d < g.headDim; ++d) {
            dqRow[d] += dScore * kRow[d];
            dkRow[d] += dScore * qRow[d];
          }
          for (int64_t d = 0; d < g.valueDim; ++d) dvRow[d] += probability[n] * dOutRow[d];
        }
      }
  }
}

// The f32 instances in AVX2 clones (see FastMath.h): the dot products, exps and row updates double
// their SIMD width.
DGEMMA_CPU_CLONES_FOR_AVX2 void attentionRowsF32(const AttentionContract& g, const AttentionTensors<float>& t,
                                                 int64_t begin, int64_t end) {
  attentionRows(g, t, begin, end);
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
    const int64_t* segmentIds = geometry_.segmented ? inputs[4].as<const int64_t>() : nullptr;
    const AttentionTensors<T> tensors{inputs[0].as<const T>(),
                                      inputs[1].as<const T>(),
                                      inputs[2].as<const T>(),
                                      inputs[3].as<const uint8_t>(),
                                      segmentIds,
                                      nullptr,
                                      outputs[0].as<T>(),
                                      nullptr,
                                      nullptr};
    const AttentionContract& g = geometry_;
    const int64_t rows = g.batch * g.queries * g.queryHeads;
    cpu::parallelFor(context, rows, cpu::rowGrain(g.keys * (g.headDim + g.valueDim)), [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float>)
        attentionRowsF32(g, tensors, begin, end);
      else
        attentionRows(g, tensors, begin, end);
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
    const int64_t* segmentIds = geometry_.segmented ? inputs[5].as<const int64_t>() : nullptr;
    const AttentionTensors<T> tensors{inputs[0].as<const T>(),
                                      inputs[1].as<const T>(),
                                      inputs[2].as<const T>(),
                                      inputs[3].as<const uint8_t>(),
                                      segmentIds,
                                      inputs[4].as<const T>(),
                                      outputs[0].as<T>(),
                                      outputs[1].as<T>(),
                                      outputs[2].as<T>()};
    const AttentionContract& g = geometry_;
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
