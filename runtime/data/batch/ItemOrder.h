// The order in which training items are visited (docs/data.md, "Item order"). `cyclic`: a fresh
// permutation of the item indices per epoch, a pure function of (data seed, epoch), so a run
// resumes from the consumed-samples count alone and the data order never draws from any other
// random stream. `single`: sequential order (mock data, evaluation).
#pragma once

#include <cstdint>
#include <vector>

namespace dgemma {

enum class SamplerKind { Cyclic, Single };

class ItemOrder {
 public:
  ItemOrder(SamplerKind kind, int64_t numItems, uint64_t seed);

  // The item visited as the `consumed`-th sample overall (epoch = consumed / numItems).
  int64_t itemAt(int64_t consumed);
  int64_t numItems() const { return numItems_; }

 private:
  const std::vector<int64_t>& permutation(int64_t epoch);

  SamplerKind kind_;
  int64_t numItems_;
  uint64_t seed_;
  int64_t cachedEpoch_ = -1;
  std::vector<int64_t> cached_;
};

}  // namespace dgemma
