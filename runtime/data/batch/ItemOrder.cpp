#include "runtime/data/batch/ItemOrder.h"

#include <numeric>
#include <stdexcept>

#include "support/Error.h"
#include "runtime/core/Philox.h"

namespace dgemma {

namespace {
// A Philox stream reserved for the data order, apart from the noise streams of training.
constexpr uint64_t kDataOrderStream = 0x0da7a0;
}  // namespace

ItemOrder::ItemOrder(SamplerKind kind, int64_t numItems, uint64_t seed) : kind_(kind), numItems_(numItems), seed_(seed) {
  if (numItems < 1) throw InputError("dataset: expected at least one item, got " + std::to_string(numItems));
}

int64_t ItemOrder::itemAt(int64_t consumed) {
  if (consumed < 0) throw InputError("consumed_samples: expected a non-negative count, got " + std::to_string(consumed));
  if (kind_ == SamplerKind::Single) return consumed % numItems_;
  return permutation(consumed / numItems_)[consumed % numItems_];
}

// Fisher–Yates driven by counter-based draws: draw j of epoch e is Philox(seed; stream, offset = e, j).
// The modulo bias of a 32-bit word is below 2^-32 * numItems, negligible for dataset sizes here.
const std::vector<int64_t>& ItemOrder::permutation(int64_t epoch) {
  if (epoch == cachedEpoch_) return cached_;
  cached_.resize(numItems_);
  std::iota(cached_.begin(), cached_.end(), 0);
  for (int64_t i = numItems_ - 1; i > 0; --i) {
    const uint64_t draw = static_cast<uint64_t>(numItems_ - 1 - i);
    const uint32_t word = philoxUniformBlock(seed_, kDataOrderStream, static_cast<uint64_t>(epoch), draw / 4)[draw % 4];
    std::swap(cached_[i], cached_[word % static_cast<uint64_t>(i + 1)]);
  }
  cachedEpoch_ = epoch;
  return cached_;
}

}  // namespace dgemma
