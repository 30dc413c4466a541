// cross_entropy and cross_entropy_backward: softmax cross-entropy over the last dimension, one row per
// position, with an optional bonus added to one logit of each row (the leave-one-out objective):
// z = cap(logits) + bonus · onehot(bonus_id), ce = logsumexp(z) − z[target], where cap is the
// soft-cap c · tanh(x / c) when the `softcap` attribute c is positive. The capped row lives in a
// per-thread scratch row, so no [..., V] tensor of capped logits exists.
//
// The max and the sum of the exps are taken in f64 for f32 logits too. The reference is fp64 torch,
// and V reaches 262144: a running f32 sum of that many exps is off by about 2e-4 relative (for
// logits uniform in [-4, 4]; the bound is V · 2^-24 ≈ 2e-2), which shows as about 1e-5 in the loss
// and in every probability of the gradient. Each exp itself is taken in the logits' dtype: for f32
// that is fastExp (within 2 ulp, so the f64 sum stays within about 2e-7 relative), whose loop
// vectorises, where a libm exp per logit was most of these kernels' time.
//
// Passes over a row, each an AVX2 clone for f32: the cap (which also takes the row's maximum; a
// maximum is exact in any order), the exps and their sum, and in the backward one more that scales
// the exps and applies the cap's derivative. The last is compiled without FMA, so its roundings are
// the separate IEEE operations written, whatever CPU runs it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "support/Error.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/cross_entropy/Contract.h"

namespace dgemma {
namespace {

// An id tensor of either integer width, read as int64.
struct Ids {
  const void* data = nullptr;
  bool wide = true;  // i64, else i32

  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

// One row's z: the logits in f64, with the bonus added at bonusId (-1 when there is no bonus).
template <typename T>
struct BonusedRow {
  const T* logits;
  int64_t bonusId;
  double bonus;

  double operator[](int64_t j) const { return static_cast<double>(logits[j]) + (j == bonusId ? bonus : 0.0); }
};

// logsumexp(z) = maximum + log(sum), with sum = Σ exp(z_j − maximum).
struct Normalizer {
  double maximum;
  double sum;
};

// The loops below keep eight partial results so that they vectorise (see cpu::dotProduct).
constexpr int64_t kLanes = 8;


// Folds values[begin, end) into the kLanes running maxima `partial`.
template <typename T>
[[gnu::always_inline]] inline void foldMaximum(const T* values, int64_t begin, int64_t end, T* partial) {
  int64_t j = begin;
  for (; j + kLanes <= end; j += kLanes)
    for (int64_t lane = 0; lane < kLanes; ++lane) partial[lane] = std::max(partial[lane], values[j + lane]);
  for (; j < end; ++j) partial[0] = std::max(partial[0], values[j]);
}

// The largest of `running` and the running maxima, as f64.
template <typename T>
[[gnu::always_inline]] inline double maximumOfLanes(const T* partial, double running) {
  for (int64_t lane = 0; lane < kLanes; ++lane) running = std::max(running, static_cast<double>(partial[lane]));
  return running;
}

// max(running, logits[begin..end)), as f64.
template <typename T>
[[gnu::always_inline]] inline double maximumOf(const T* logits, int64_t begin, int64_t end, double running) {
  T partial[kLanes];
  std::fill_n(partial, kLanes, -std::numeric_limits<T>::infinity());
  foldMaximum(logits, begin, end, partial);
  return maximumOfLanes(partial, running);
}

// Σ exp(j) over [begin, end) in eight f64 partial sums, each term also written to exps[j] when exps
// is not null.
template <typename T, typename Exp>
[[gnu::always_inline]] inline double sumOfTermsIn(int64_t begin, int64_t end, T* exps, const Exp& exp) {
  double partial[kLanes] = {};
  int64_t j = begin;
  if (exps != nullptr) {
    for (; j + kLanes <= end; j += kLanes)
      for (int64_t lane = 0; lane < kLanes; ++lane) partial[lane] += (exps[j + lane] = exp(j + lane));
    for (; j < end; ++j) partial[0] += (exps[j] = exp(j));
  } else {
    for (; j + kLanes <= end; j += kLanes)
      for (int64_t lane = 0; lane < kLanes; ++lane) partial[lane] += exp(j + lane);
    for (; j < end; ++j) partial[0] += exp(j);
  }
  double sum = 0;
  for (int64_t lane = 0; lane < kLanes; ++lane) sum += partial[lane];
  return sum;
}

// Σ exp(logits[j] − maximum) over [begin, end), writing each exp to exps[j] when exps is not null.
// Always inlined, so that the AVX2 clone below compiles this loop for its own target.
template <typename T>
[[gnu::always_inline]] inline double sumOfExpsIn(const T* logits, int64_t begin, int64_t end, double maximum, T* exps) {
  if constexpr (std::is_same_v<T, float>) {
    // The maximum of a row without a bonus is one of its f32 logits. Then each difference is taken
    // in f32: that rounds the exact difference once, and the f64 difference rounded to f32 rounds it
    // twice, which gives the same bits because f64 has at least 2 · 24 + 2 significant bits (double
    // rounding is innocuous for +, −, ×, ÷ at that width). The loop then converts no logit to f64.
    const float singleMaximum = static_cast<float>(maximum);
    if (static_cast<double>(singleMaximum) == maximum)
      return sumOfTermsIn(begin, end, exps, [&](int64_t j) { return cpu::fastExp(logits[j] - singleMaximum); });
  }
  return sumOfTermsIn(begin, end, exps,
                      [&](int64_t j) { return cpu::fastExp(static_cast<T>(static_cast<double>(logits[j]) - maximum)); });
}

// The f32 loop in AVX2 clones (see FastMath.h): the exps are these kernels' arithmetic.
DGEMMA_CPU_CLONES_FOR_AVX2 double sumOfExpsF32(const float* logits, int64_t begin, int64_t end, double maximum,
                                               float* exps) {
  return sumOfExpsIn(logits, begin, end, maximum, exps);
}

template <typename T>
double sumOfExps(const T* logits, int64_t begin, int64_t end, double maximum, T* exps) {
  if constexpr (std::is_same_v<T, float>)
    return sumOfExpsF32(logits, begin, end, maximum, exps);
  else
    return sumOfExpsIn(logits, begin, end, maximum, exps);
}

// The maximum of a row's plain logits: all but the bonused one (skip; -1 when there is none).
template <typename T>
[[gnu::always_inline]] inline double plainMaximumIn(const T* logits, int64_t length, int64_t skip) {
  const double lowest = -std::numeric_limits<double>::infinity();
  if (skip < 0) return maximumOf(logits, 0, length, lowest);
  return maximumOf(logits, skip + 1, length, maximumOf(logits, 0, skip, lowest));
}
DGEMMA_CPU_CLONES_FOR_AVX2 double plainMaximumF32(const float* logits, int64_t length, int64_t skip) {
  return plainMaximumIn(logits, length, skip);
}

template <typename T>
double plainMaximum(const T* logits, int64_t length, int64_t skip) {
  if constexpr (std::is_same_v<T, float>)
    return plainMaximumF32(logits, length, skip);
  else
    return plainMaximumIn(logits, length, skip);
}

// The bonused logit splits the row into the plain logits before it, itself, and those after it.
// `exps` (null when not wanted) receives each exp(z_j − maximum). `maximum` is the plain logits'.
template <typename T>
Normalizer normalize(const BonusedRow<T>& z, int64_t length, double maximum, T* exps) {
  const bool hasBonus = z.bonusId >= 0;
  const int64_t plainEnd = hasBonus ? z.bonusId : length;
  if (hasBonus) maximum = std::max(maximum, z[z.bonusId]);
  double sum = sumOfExps(z.logits, 0, plainEnd, maximum, exps);
  if (hasBonus) {
    const T e = cpu::fastExp(static_cast<T>(z[z.bonusId] - maximum));
    if (exps != nullptr) exps[z.bonusId] = e;
    sum += e + sumOfExps(z.logits, z.bonusId + 1, length, maximum, exps);
  }
  return {maximum, sum};
}

// The inputs both kernels read, as rows: logits, targets, then bonus ids and bonus when present.
template <typename T>
struct CrossEntropyRows {
  const T* logits = nullptr;
  int64_t vocabulary = 0;
  Ids targets, bonusIds;
  const T* bonus = nullptr;  // null when there is no bonus

  BonusedRow<T> row(int64_t r) const {
    if (bonus == nullptr) return {logits + r * vocabulary, -1, 0.0};
    return {logits + r * vocabulary, bonusIds[r], static_cast<double>(bonus[r])};
  }
};

// tanh(x / c) and c · tanh(x / c) over [begin, end) of a row, in T and in the order of the div, tanh
// and mul ops the kernel replaces (so the capped logits round as they did).
template <typename T>
[[gnu::always_inline]] inline void capRangeIn(const T* x, int64_t begin, int64_t end, T cap, T* squashed, T* capped) {
  for (int64_t j = begin; j < end; ++j) {
    squashed[j] = cpu::fastTanh(x[j] / cap);
    capped[j] = squashed[j] * cap;
  }
}


// Caps the whole row and returns the maximum of its plain capped logits (all but `skip`, the
// bonused one, or -1), as f64. Block by block, each block's maximum taken while its capped logits
// are still in L1: one pass over the row instead of a cap pass and a max pass. (Folding the max
// into the cap loop itself kept that loop from vectorising as well, and was slower.)
template <typename T>
[[gnu::always_inline]] inline double capRowIn(const T* x, int64_t length, T cap, int64_t skip, T* squashed, T* capped) {
  constexpr int64_t kBlock = 1024;
  T partial[kLanes];
  std::fill_n(partial, kLanes, -std::numeric_limits<T>::infinity());
  for (int64_t begin = 0; begin < length; begin += kBlock) {
    const int64_t end = std::min(length, begin + kBlock);
    capRangeIn(x, begin, end, cap, squashed, capped);
    if (skip < begin || skip >= end) {
      foldMaximum(capped, begin, end, partial);
    } else {
      foldMaximum(capped, begin, skip, partial);
      foldMaximum(capped, skip + 1, end, partial);
    }
  }
  return maximumOfLanes(partial, -std::numeric_limits<double>::infinity());
}
DGEMMA_CPU_CLONES_FOR_AVX2 double capRowF32(const float* x, int64_t length, float cap, int64_t skip, float* squashed,
                                            float* capped) {
  return capRowIn(x, length, cap, skip, squashed, capped);
}

// The soft-capped row for this thread: `squashed` holds tanh(x / c) for the backward's 1 − tanh².
template <typename T>
struct CappedRow {
  std::vector<T> squashed, capped;

  static CappedRow& forThisThread(int64_t length) {
    thread_local CappedRow row;
    row.squashed.resize(static_cast<size_t>(length));
    row.capped.resize(static_cast<size_t>(length));
    return row;
  }
  // Caps x and returns the maximum of the plain capped logits (see capRowIn).
  double fill(const T* x, int64_t length, double cap, int64_t skip) {
    if constexpr (std::is_same_v<T, float>)
      return capRowF32(x, length, static_cast<float>(cap), skip, squashed.data(), capped.data());
    else
      return capRowIn(x, length, static_cast<T>(cap), skip, squashed.data(), capped.data());
  }
};

// Row r's z, its logits capped into `scratch` when the kernel caps, and the maximum of its plain
// logits (all but the bonused one).
template <typename T>
struct PreparedRow {
  BonusedRow<T> z;
  double plainMaximum;
};

template <typename T>
PreparedRow<T> rowOf(const CrossEntropyRows<T>& rows, int64_t r, const CrossEntropyContract& geometry,
                     CappedRow<T>* scratch) {
  BonusedRow<T> z = rows.row(r);
  if (scratch == nullptr) return {z, plainMaximum(z.logits, geometry.vocabulary, z.bonusId)};
  const double maximum = scratch->fill(z.logits, geometry.vocabulary, geometry.softcap, z.bonusId);
  z.logits = scratch->capped.data();
  return {z, maximum};
}

// The backward's last pass over a row of exps e_j: grad_j = e_j · scale, rounded to T, then times
// 1 − tanh²(x_j / c) when `squashed` is not null. Its f32 clone has no FMA (see the file comment).
template <typename T>
[[gnu::always_inline]] inline void scaleRowIn(T* grad, int64_t length, double scale, const T* squashed) {
  if (squashed == nullptr) {
    for (int64_t j = 0; j < length; ++j) grad[j] = static_cast<T>(static_cast<double>(grad[j]) * scale);
    return;
  }
  for (int64_t j = 0; j < length; ++j) {
    const T probabilityTerm = static_cast<T>(static_cast<double>(grad[j]) * scale);
    grad[j] = static_cast<T>(probabilityTerm * (T(1) - squashed[j] * squashed[j]));
  }
}
DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA void scaleRowF32(float* grad, int64_t length, double scale,
                                                        const float* squashed) {
  scaleRowIn(grad, length, scale, squashed);
}

template <typename T>
void scaleRow(T* grad, int64_t length, double scale, const T* squashed) {
  if constexpr (std::is_same_v<T, float>)
    scaleRowF32(grad, length, scale, squashed);
  else
    scaleRowIn(grad, length, scale, squashed);
}

void checkIds(const std::string& where, const CrossEntropyContract& geometry, const Ids& ids, const char* role) {
  for (int64_t r = 0; r < geometry.rows; ++r)
    if (ids[r] < 0 || ids[r] >= geometry.vocabulary)
      throw RuntimeError(idOutsideVocabularyMessage(where, role, ids[r], r, geometry.vocabulary));
}

// Checks every id serially, before any output is written.
template <typename T>
CrossEntropyRows<T> readRows(const std::string& where, const CrossEntropyContract& geometry,
                             const std::vector<TensorRef>& inputs) {
  CrossEntropyRows<T> rows;
  rows.logits = inputs[0].as<const T>();
  rows.vocabulary = geometry.vocabulary;
  rows.targets = {inputs[1].data, geometry.wideTargets};
  checkIds(where, geometry, rows.targets, "target");
  if (geometry.hasBonus) {
    rows.bonusIds = {inputs[2].data, geometry.wideBonusIds};
    rows.bonus = inputs[3].as<const T>();
    checkIds(where, geometry, rows.bonusIds, "bonus");
  }
  return rows;
}

template <typename T>
class CrossEntropyKernel final : public Kernel {
 public:
  CrossEntropyKernel(std::string where, CrossEntropyContract geometry) : where_(std::move(where)), geometry_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const CrossEntropyRows<T> rows = readRows<T>(where_, geometry_, inputs);
    T* loss = outputs[0].as<T>();
    const int64_t length = geometry_.vocabulary;
    cpu::parallelFor(context, geometry_.rows, cpu::rowGrain(length), [&](int64_t begin, int64_t end) {
      CappedRow<T>* scratch = geometry_.softcap > 0 ? &CappedRow<T>::forThisThread(length) : nullptr;
      for (int64_t r = begin; r < end; ++r) {
        const PreparedRow<T> prepared = rowOf(rows, r, geometry_, scratch);
        const BonusedRow<T>& z = prepared.z;
        const Normalizer normalizer = normalize<T>(z, length, prepared.plainMaximum, nullptr);
        loss[r] = static_cast<T>(normalizer.maximum + std::log(normalizer.sum) - z[rows.targets[r]]);
      }
    });
  }

 private:
  std::string where_;  // run-time errors name the step as the plan loader does
  CrossEntropyContract geometry_;
};

// grad_logits = grad_output[..., None] · (softmax(z) − onehot(target)), times 1 − tanh²(x / c) when
// the kernel caps; each row's exps are kept in the output between the sum and the scaling.
template <typename T>
class CrossEntropyBackwardKernel final : public Kernel {
 public:
  CrossEntropyBackwardKernel(std::string where, CrossEntropyContract geometry)
      : where_(std::move(where)), geometry_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const CrossEntropyRows<T> rows = readRows<T>(where_, geometry_, inputs);
    const T* gradOutput = inputs.back().as<const T>();
    T* gradLogits = outputs[0].as<T>();
    const int64_t length = geometry_.vocabulary;
    cpu::parallelFor(context, geometry_.rows, cpu::rowGrain(length), [&](int64_t begin, int64_t end) {
      CappedRow<T>* scratch = geometry_.softcap > 0 ? &CappedRow<T>::forThisThread(length) : nullptr;
      for (int64_t r = begin; r < end; ++r) {
        const PreparedRow<T> prepared = rowOf(rows, r, geometry_, scratch);
        const BonusedRow<T>& z = prepared.z;
        T* gradRow = gradLogits + r * length;
        const Normalizer normalizer = normalize(z, length, prepared.plainMaximum, gradRow);
        const double g = static_cast<double>(gradOutput[r]);
        const T* squashed = scratch != nullptr ? scratch->squashed.data() : nullptr;
        scaleRow(gradRow, length, g / normalizer.sum, squashed);
        // The target's probability from z itself, so that p − 1 keeps its digits when p is near 1.
        const int64_t target = rows.targets[r];
        const double probability = std::exp(z[target] - normalizer.maximum) / normalizer.sum;
        gradRow[target] = static_cast<T>(g * (probability - 1.0));
        if (squashed != nullptr)
          gradRow[target] = static_cast<T>(gradRow[target] * (T(1) - squashed[target] * squashed[target]));
      }
    });
  }

 private:
  std::string where_;
  CrossEntropyContract geometry_;
};

std::unique_ptr<Kernel> createCrossEntropyKernel(const KernelSignature& signature) {
  const CrossEntropyContract contract = parseCrossEntropyContract(signature, {DType::F32, DType::F64});
  if (contract.dtype == DType::F64) return std::make_unique<CrossEntropyKernel<double>>(signature.where, contract);
  return std::make_unique<CrossEntropyKernel<float>>(signature.where, contract);
}

std::unique_ptr<Kernel> createCrossEntropyBackwardKernel(const KernelSignature& signature) {
  const CrossEntropyContract contract = parseCrossEntropyBackwardContract(signature, {DType::F32, DType::F64});
  if (contract.dtype == DType::F64)
    return std::make_unique<CrossEntropyBackwardKernel<double>>(signature.where, contract);
  return std::make_unique<CrossEntropyBackwardKernel<float>>(signature.where, contract);
}

}  // namespace

void registerCrossEntropyCpuKernels(KernelRegistry& registry) {
  registry.add("cross_entropy", createCrossEntropyKernel);
  registry.add("cross_entropy_backward", createCrossEntropyBackwardKernel);
}

}  // namespace dgemma
