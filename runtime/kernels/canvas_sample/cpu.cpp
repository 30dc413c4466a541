// canvas_sample on the CPU (docs/kernels.md, "canvas_sample"): per (b, l) one streaming pass over the
// vocabulary, in chunks that stay in L1. Each chunk is soft-capped when the kernel caps (the
// arithmetic of the div, tanh and mul kernels it replaces, so the capped logits round as theirs did),
// divided by the temperature and stored as the scaled output, then folds into the running statistics
// (RunningSoftmax: the max, with the rescaling of an online softmax when it grows), the first index of
// the max, and the Gumbel-max key z + g.
// Nothing of size V is allocated. Threads split the B·L positions.
//
// The noise is most of the cost (a Philox block per four entries, two logs per entry). An entry with
// z + 17 below the best key so far cannot win whatever its noise (GumbelNoise.h), so a chunk with
// few entries left in the race computes just theirs; otherwise the chunk's Philox words run as one
// loop that vectorises, and the logs are taken only for the words large enough to lift the chunk's
// max above the best key (cellsThatCannotWin: after the first chunks, a fraction of a percent of
// them), or for every word while no such bound exists. All ways choose the same id.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "runtime/core/Philox.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/canvas_sample/Contract.h"
#include "runtime/kernels/canvas_sample/GumbelNoise.h"
#include "support/DType.h"
#include "support/Error.h"

namespace dgemma {
namespace {

using canvas_sample::gumbelNoise;
using canvas_sample::kGumbelNoiseBound;

// Vocabulary entries per chunk: the chunk's z (1 KiB) is reread from L1 by the later folds.
constexpr int64_t kChunk = 256;
// Independent partial sums, so that the f64 accumulation maps onto SIMD lanes (see dotProduct).
constexpr int64_t kLanes = 8;
// Below this, e^(z−m) is 0 in f32; clamping z − m there keeps 0 · (z − m) from becoming 0 · −inf.
constexpr float kLowestExponent = -104.0f;

// The softmax statistics of the entries seen so far, relative to their max m: `ties` entries equal
// m (each e^0 = 1), `rest` = Σ e^(z−m) over the others, `weighted` = Σ e^(z−m)·(z−m), in f64. The
// entropy −Σ p log p with p = e^(z−m) / s, s = ties + rest, is H = log s − weighted / s: both terms
// are non-negative (z − m <= 0), so nothing cancels, and log s = log ties + log1p(rest / ties) keeps
// a nearly one-hot position's tiny entropy (s = 1 + 1e-20) to full relative precision, which
// Σ e^(z−m) with the max's 1 inside could not.
struct RunningSoftmax {
  float maximum = -std::numeric_limits<float>::infinity();
  double ties = 0, rest = 0, weighted = 0;

  // A new, larger max: the old entries' terms shrink by e^(old − new); the old ties join the rest.
  void raiseMaximum(float larger) {
    const double count = ties + rest;
    if (count > 0) {
      const double shift = static_cast<double>(maximum) - larger;
      const double scale = std::exp(shift);
      weighted = scale * (weighted + shift * count);
      rest = scale * count;
      ties = 0;
    }
    maximum = larger;
  }
  double entropy() const { return std::log(ties) + std::log1p(rest / ties) - weighted / (ties + rest); }
};

// The chunk computes all its Philox words when at least this share of its entries can still win.
constexpr int64_t kWholeChunkNoiseDivisor = 4;

// Words whose cell k = word >> 9 is below the result give no entry z <= chunkMax a key z + g above
// bestKey. g(u) = −log(−log u) increases with u = (2k + 1) · 2^-24, and equals `gap` at
// u = e^(−e^(−gap)); the gap keeps a margin (a quarter, plus 1e-6 of the magnitudes) far above
// gumbelNoise's error (about 1e-6: two logs within a few ulp) and the rounding of the f32 sum z + g,
// so a skipped entry's computed key would stay below bestKey: it could not have won. 0 when there is
// no bound (no best key yet, or NaN and infinite keys).
inline uint32_t cellsThatCannotWin(float bestKey, float chunkMax) {
  const double best = bestKey, top = chunkMax;
  const double gap = best - top - 0.25 - 1e-6 * (std::fabs(best) + std::fabs(top));
  // Below −3 the bound e^(−e^3) ≈ 2e-9 is under the smallest u; NaN (from infinities) gives no bound.
  if (!(gap > -3.0)) return 0;
  constexpr double kCells = 1 << 23;
  // k < (bound · 2^24 − 1) / 2 gives u(k) = (2k + 1) · 2^-24 < bound.
  const double cells = std::floor((std::exp(-std::exp(-gap)) * (2 * kCells) - 1.0) / 2.0);
  return cells <= 0 ? 0 : static_cast<uint32_t>(std::min(cells, kCells));
}

// The Philox blocks [firstBlock, firstBlock + blocks) of stream 0 under (seed, offset), word w of
// block j into words[4j + w]: philox4x32x10 with the blocks in SIMD lanes (blocks <= kChunk / 4).
DGEMMA_CPU_CLONES_FOR_AVX2 void fillBlocks(uint64_t seed, uint64_t offset, uint64_t firstBlock, int64_t blocks,
                                           uint32_t* words) {
  constexpr int64_t kMaxBlocks = kChunk / 4;
  uint32_t c0[kMaxBlocks], c1[kMaxBlocks], c2[kMaxBlocks], c3[kMaxBlocks];
  for (int64_t j = 0; j < blocks; ++j) {
    const uint64_t block = firstBlock + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(block);
    c1[j] = static_cast<uint32_t>(block >> 32);
    c2[j] = static_cast<uint32_t>(offset);
    c3[j] = static_cast<uint32_t>(offset >> 32);
  }
  uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += 0x9E3779B9u;
      key1 += 0xBB67AE85u;
    }
    for (int64_t j = 0; j < blocks; ++j) {
      const uint64_t product0 = static_cast<uint64_t>(0xD2511F53u) * c0[j];
      const uint64_t product1 = static_cast<uint64_t>(0xCD9E8D57u) * c2[j];
      const uint32_t next0 = static_cast<uint32_t>(product1 >> 32) ^ c1[j] ^ key0;
      const uint32_t next2 = static_cast<uint32_t>(product0 >> 32) ^ c3[j] ^ key1;
      c0[j] = next0;
      c1[j] = static_cast<uint32_t>(product1);
      c2[j] = next2;
      c3[j] = static_cast<uint32_t>(product0);
    }
  }
  for (int64_t j = 0; j < blocks; ++j) {
    words[4 * j] = c0[j];
    words[4 * j + 1] = c1[j];
    words[4 * j + 2] = c2[j];
    words[4 * j + 3] = c3[j];
  }
}

// Element `index`'s Philox word of one row's stream, one block of four words computed at a time.
class RowWords {
 public:
  RowWords(uint64_t seed, uint64_t offset) : seed_(seed), offset_(offset) {}
  uint32_t at(uint64_t index) {
    const uint64_t block = index / 4;
    if (block != block_) {
      words_ = philoxUniformBlock(seed_, 0, offset_, block);
      block_ = block;
    }
    return words_[index % 4];
  }
  // The words of elements [first, first + count), count <= kChunk. Whole blocks run as one loop
  // over the blocks per Philox round, which vectorises (the same integer arithmetic as
  // philox4x32x10, so the same words).
  void fill(uint64_t first, int64_t count, uint32_t* words) {
    if (first % 4 != 0 || count % 4 != 0) {
      for (int64_t i = 0; i < count; ++i) words[i] = at(first + static_cast<uint64_t>(i));
      return;
    }
    fillBlocks(seed_, offset_, first / 4, count / 4, words);
  }

 private:
  uint64_t seed_, offset_;
  uint64_t block_ = std::numeric_limits<uint64_t>::max();
  PhiloxCounter words_{};
};

// Entry i's terms relative to the max: ties[i] (1 when z = m), rests[i] = e^(z−m) for the others
// and weights[i] = e^(z−m)·(z−m).
[[gnu::always_inline]] inline void softmaxTerms(const float* z, int64_t count, float maximum, float* ties, float* rests,
                                                float* weights) {
  for (int64_t i = 0; i < count; ++i) {
    // Selects rather than std::max and a bool conversion, whose branches keep GCC from vectorising.
    const float difference = z[i] - maximum;
    const float shifted = cpu::fastmath_detail::select(difference < kLowestExponent, kLowestExponent, difference);
    const float e = cpu::fastExp(shifted);
    const float tie = cpu::fastmath_detail::select(shifted == 0.0f, 1.0f, 0.0f);
    ties[i] = tie;
    rests[i] = e * (1.0f - tie);
    weights[i] = e * shifted;
  }
}

struct PositionResult {
  int64_t sampled = 0, argmax = 0;
  float entropy = 0;
};

// z = cap(x) / temperature for a chunk; cap(x) = softcap · tanh(x / softcap) when softcap > 0.
[[gnu::always_inline]] inline void scaleChunk(const float* x, int64_t count, float softcap, float temperature, float* z) {
  if (softcap > 0)
    for (int64_t i = 0; i < count; ++i) z[i] = cpu::fastTanh(x[i] / softcap) * softcap / temperature;
  else
    for (int64_t i = 0; i < count; ++i) z[i] = x[i] / temperature;
}

// One position: logits[0, V) -> its results, the scaled row stored through `store(start, z, count)`.
template <typename Store>
[[gnu::always_inline]] inline PositionResult samplePositionIn(const float* logits, int64_t vocab, float softcap,
                                                              float temperature, RowWords& words, uint64_t firstIndex,
                                                              Store&& store) {
  RunningSoftmax softmax;
  float bestKey = -std::numeric_limits<float>::infinity();
  PositionResult result;
  float z[kChunk];
  for (int64_t start = 0; start < vocab; start += kChunk) {
    const int64_t count = std::min(kChunk, vocab - start);
    scaleChunk(logits + start, count, softcap, temperature, z);
    const float chunkMax = cpu::laneMaximum(z, count);
    store(start, z, count);
    if (chunkMax > softmax.maximum) {  // strict: an equal max in a later chunk keeps the lower index
      result.argmax = start + (std::find(z, z + count, chunkMax) - z);
      softmax.raiseMaximum(chunkMax);
    }
    if (softmax.maximum != -std::numeric_limits<float>::infinity()) {  // all -inf so far: nothing to add
      // Each entry's terms in f32 (one vectorised loop), then summed in f64 lanes: a tie counts 1
      // and adds nothing to the others.
      float ties[kChunk], rests[kChunk], weights[kChunk];
      softmaxTerms(z, count, softmax.maximum, ties, rests, weights);
      double tieLanes[kLanes] = {}, restLanes[kLanes] = {}, weightedLanes[kLanes] = {};
      int64_t i = 0;
      for (; i + kLanes <= count; i += kLanes)
        for (int64_t lane = 0; lane < kLanes; ++lane) {
          tieLanes[lane] += ties[i + lane];
          restLanes[lane] += rests[i + lane];
          weightedLanes[lane] += weights[i + lane];
        }
      for (; i < count; ++i) {
        tieLanes[0] += ties[i];
        restLanes[0] += rests[i];
        weightedLanes[0] += weights[i];
      }
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        softmax.ties += tieLanes[lane];
        softmax.rest += restLanes[lane];
        softmax.weighted += weightedLanes[lane];
      }
    }
    int64_t contenders = 0;
    for (int64_t i = 0; i < count; ++i) contenders += z[i] + kGumbelNoiseBound >= bestKey ? 1 : 0;
    if (contenders * kWholeChunkNoiseDivisor >= count) {
      uint32_t chunkWords[kChunk];
      words.fill(firstIndex + static_cast<uint64_t>(start), count, chunkWords);
      if (const uint32_t losingCells = cellsThatCannotWin(bestKey, chunkMax); losingCells > 0) {
        // In index order, with the strict >, as the loop over all keys below: the same first winner.
        for (int64_t i = 0; i < count; ++i) {
          if ((chunkWords[i] >> 9) < losingCells) continue;  // its noise is too small to win
          const float key = z[i] + gumbelNoise(chunkWords[i]);
          if (key > bestKey) {
            bestKey = key;
            result.sampled = start + i;
          }
        }
      } else {
        float keys[kChunk];
        for (int64_t i = 0; i < count; ++i) keys[i] = z[i] + gumbelNoise(chunkWords[i]);
        for (int64_t i = 0; i < count; ++i)
          if (keys[i] > bestKey) {
            bestKey = keys[i];
            result.sampled = start + i;
          }
      }
    } else {
      for (int64_t i = 0; i < count; ++i) {
        if (z[i] + kGumbelNoiseBound < bestKey) continue;  // cannot win, whatever its noise
        const float key = z[i] + gumbelNoise(words.at(firstIndex + static_cast<uint64_t>(start + i)));
        if (key > bestKey) {
          bestKey = key;
          result.sampled = start + i;
        }
      }
    }
  }
  result.entropy = static_cast<float>(softmax.entropy());
  return result;
}

// The two instances in AVX2 clones (see FastMath.h): the exps, the divisions and the noise's fmas. The
// soft-cap's tanh rounds as the tanh kernel's clone for the same target does (elementwise/cpu.cpp).
DGEMMA_CPU_CLONES_FOR_AVX2 PositionResult samplePositionF32(const float* logits, int64_t vocab, float softcap,
                                                            float temperature, RowWords& words, uint64_t firstIndex,
                                                            float* scaled) {
  return samplePositionIn(logits, vocab, softcap, temperature, words, firstIndex,
                          [&](int64_t start, const float* z, int64_t count) { std::copy(z, z + count, scaled + start); });
}

DGEMMA_CPU_CLONES_FOR_AVX2 PositionResult samplePositionBf16(const float* logits, int64_t vocab, float softcap,
                                                             float temperature, RowWords& words, uint64_t firstIndex,
                                                             uint16_t* scaled) {
  return samplePositionIn(logits, vocab, softcap, temperature, words, firstIndex,
                          [&](int64_t start, const float* z, int64_t count) {
                            for (int64_t i = 0; i < count; ++i) scaled[start + i] = f32ToBf16Bits(z[i]);
                          });
}

class CanvasSampleKernel final : public Kernel {
 public:
  CanvasSampleKernel(std::string where, CanvasSampleContract contract) : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const float* logits = inputs[0].as<const float>();
    const float* temperature = inputs[1].as<const float>();
    const int64_t* keys = inputs[2].as<const int64_t>();
    for (int64_t b = 0; b < c_.batch; ++b)
      if (!(temperature[b] > 0.0f) || !std::isfinite(temperature[b]))
        throw RuntimeError(where_ + ": temperature[" + std::to_string(b) + "] = " + std::to_string(temperature[b]) +
                           " is not a positive finite number");
    int64_t* sampled = outputs[0].as<int64_t>();
    int64_t* argmax = outputs[1].as<int64_t>();
    float* entropy = outputs[2].as<float>();
    const int64_t positions = c_.batch * c_.canvas, vocab = c_.vocab;
    cpu::parallelFor(context, positions, cpu::rowGrain(vocab), [&](int64_t begin, int64_t end) {
      for (int64_t position = begin; position < end; ++position) {
        const int64_t b = position / c_.canvas, l = position % c_.canvas;
        RowWords words(static_cast<uint64_t>(keys[2 * b]), static_cast<uint64_t>(keys[2 * b + 1]));
        const uint64_t firstIndex = static_cast<uint64_t>(l) * static_cast<uint64_t>(vocab);
        const float* row = logits + position * vocab;
        const PositionResult result =
            c_.scaledDType == DType::BF16
                ? samplePositionBf16(row, vocab, c_.softcap, temperature[b], words, firstIndex,
                                     outputs[3].as<uint16_t>() + position * vocab)
                : samplePositionF32(row, vocab, c_.softcap, temperature[b], words, firstIndex,
                                    outputs[3].as<float>() + position * vocab);
        sampled[position] = result.sampled;
        argmax[position] = result.argmax;
        entropy[position] = result.entropy;
      }
    });
  }

 private:
  std::string where_;
  CanvasSampleContract c_;
};

std::unique_ptr<Kernel> createCanvasSampleKernel(const KernelSignature& signature) {
  return std::make_unique<CanvasSampleKernel>(signature.where, parseCanvasSampleContract(signature));
}

}  // namespace

void registerCanvasSampleCpuKernels(KernelRegistry& registry) {
  registry.add("canvas_sample", createCanvasSampleKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
