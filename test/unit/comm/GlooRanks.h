// Test support: several ranks as threads of one process, meeting through one Gloo HashStore, as
// the communicator, executor and collective-plan tests run them.
#pragma once

#include <gloo/rendezvous/hash_store.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace dgemma::test {

// Runs body(rank, store) on `size` threads and returns what each rank threw ("" when it finished),
// so that every rank runs to the end and the caller reports a failing rank by its number.
inline std::vector<std::string> runOnRanks(
    int64_t size, const std::function<void(int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store)>& body) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::string> failures(static_cast<size_t>(size));
  std::vector<std::thread> ranks;
  for (int64_t rank = 0; rank < size; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        body(rank, store);
      } catch (const std::exception& error) {
        failures[static_cast<size_t>(rank)] = error.what();
      }
    });
  for (std::thread& rank : ranks) rank.join();
  return failures;
}

}  // namespace dgemma::test
