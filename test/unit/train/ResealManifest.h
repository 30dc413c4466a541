// An edited checkpoint manifest with its checksum recomputed: how a test gets an edit past the
// checksum to the checks behind it (a deliberately crafted manifest, not an accidental edit).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/train/CheckpointManifest.h"

namespace dgemma::test {

inline std::string resealedManifestText(nlohmann::json manifest) {
  manifest[kManifestChecksumField] = manifestChecksum(manifest);
  return manifest.dump(2) + "\n";
}

}  // namespace dgemma::test
