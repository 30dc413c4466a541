// The recomputation policies of dg-recompute and `dgemma-compile --recompute` (docs/training.md,
// "Recomputation"), in their one textual form: none, full, full:N, selective.
#ifndef COMPILER_TRANSFORMS_RECOMPUTEPOLICY_H
#define COMPILER_TRANSFORMS_RECOMPUTEPOLICY_H

#include <cstdint>
#include <optional>
#include <string>

#include "llvm/ADT/StringRef.h"

namespace mlir::dg {

struct RecomputePolicy {
  enum class Kind { None, Full, Selective };
  Kind kind = Kind::None;
  // full: the layers of one stack are replayed in chunks of this many (Megatron's uniform method);
  // only each chunk's input is kept for the backward.
  int64_t layersPerChunk = 1;

  std::string name() const {
    switch (kind) {
      case Kind::None: return "none";
      case Kind::Selective: return "selective";
      case Kind::Full: return layersPerChunk == 1 ? "full" : "full:" + std::to_string(layersPerChunk);
    }
    return "none";
  }
};

inline constexpr const char* kRecomputePolicyExpected = "none, full, full:N (N >= 1) or selective";

// nullopt for anything else than kRecomputePolicyExpected.
inline std::optional<RecomputePolicy> parseRecomputePolicy(llvm::StringRef text) {
  if (text == "none") return RecomputePolicy{RecomputePolicy::Kind::None, 1};
  if (text == "selective") return RecomputePolicy{RecomputePolicy::Kind::Selective, 1};
  if (text == "full") return RecomputePolicy{RecomputePolicy::Kind::Full, 1};
  int64_t layers = 0;
  if (text.consume_front("full:") && !text.getAsInteger(10, layers) && layers >= 1 && layers <= (int64_t{1} << 20))
    return RecomputePolicy{RecomputePolicy::Kind::Full, layers};
  return std::nullopt;
}

}  // namespace mlir::dg

#endif
