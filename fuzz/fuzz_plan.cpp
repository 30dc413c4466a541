// libFuzzer target: a plan file (docs/plan-format.md). Before the input is read its content hash
// (bytes 32..39, XXH3-64 of everything from byte 48, plan/PlanFile.cpp) is recomputed, so that a
// mutated header reaches the JSON reader and validatePlan instead of stopping at the hash check.
// Mutations of the preamble's sizes still exercise the container checks.
#include <xxhash.h>

#include <cstdint>
#include <string>

#include "fuzz/FuzzSupport.h"
#include "plan/PlanFile.h"

namespace {

constexpr size_t kPreambleBytes = 48;
constexpr size_t kHashOffset = 32;

std::string withRecomputedHash(std::string_view bytes) {
  std::string file(bytes);
  if (file.size() < kPreambleBytes) return file;
  uint64_t hash = XXH3_64bits(file.data() + kPreambleBytes, file.size() - kPreambleBytes);
  for (int i = 0; i < 8; ++i) file[kHashOffset + i] = static_cast<char>((hash >> (8 * i)) & 0xff);
  return file;
}

// The parser under test.
void readPlan(std::string_view bytes) {
  (void)dgemma::deserializePlan(withRecomputedHash(bytes), "fuzz.dgplan");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), readPlan);
  return 0;
}
