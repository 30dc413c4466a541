// moe_dispatch's routing table (docs/parallelism.md, "Expert parallelism"), computed on the host by
// the CPU kernel (cpu.cpp) and by the CUDA kernel (cuda.cu, which copies the indices to the host and
// the table back: a few integers per token, and the all-to-all that follows needs the counts on the
// host anyway), so both backends build the same table. Global expert e lives on peer e / E_local, so
// grouping the routes by global expert groups them by destination peer and, within it, by local
// expert.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "support/Error.h"

namespace dgemma::moe_dispatch {

// indices [N, k] -> slots [N, k], sendCounts [G], expertCounts [G, E_local]. An index outside
// [0, G·E_local) is a run-time error naming the first in (token, j) order, raised before any output
// is written.
inline void buildDispatchTable(const std::string& where, const int64_t* indices, int64_t tokens, int64_t topK,
                               int64_t peers, int64_t localExperts, int64_t* slots, int64_t* sendCounts,
                               int64_t* expertCounts) {
  const int64_t routes = tokens * topK, experts = peers * localExperts;
  for (int64_t route = 0; route < routes; ++route)
    if (indices[route] < 0 || indices[route] >= experts)
      throw RuntimeError(where + ": expert index " + std::to_string(indices[route]) + " at indices[" +
                         std::to_string(route / topK) + ", " + std::to_string(route % topK) +
                         "] is outside [0, num_experts = " + std::to_string(experts) + ")");
  std::fill_n(expertCounts, experts, int64_t{0});
  for (int64_t route = 0; route < routes; ++route) ++expertCounts[indices[route]];
  // Slots in (token, j) order within each expert: the permutation depends on the indices alone.
  std::vector<int64_t> nextSlot(static_cast<size_t>(experts));
  std::exclusive_scan(expertCounts, expertCounts + experts, nextSlot.begin(), int64_t{0});
  for (int64_t route = 0; route < routes; ++route) slots[route] = nextSlot[indices[route]]++;
  for (int64_t peer = 0; peer < peers; ++peer) {
    const int64_t* perExpert = expertCounts + peer * localExperts;
    sendCounts[peer] = std::accumulate(perExpert, perExpert + localExperts, int64_t{0});
  }
}

}  // namespace dgemma::moe_dispatch
