// The files that cache a dataset's index arrays (docs/pretraining.md, "Index caches"). A
// file is named by a hash of the text that defines its arrays (the key), holds that key, the arrays
// and a checksum, and is written atomically; a file that fails any check is rebuilt, never trusted.
//
// Layout (little-endian): "DGIDX001" | u64 key bytes | key | u64 array count | per array: u64
// length, int64 values | u64 XXH3-64 of every byte before it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace dgemma {

using IndexArrays = std::vector<std::vector<int64_t>>;

// Where a dataset's cache files go: `cacheDirectory` when given, else the directory of the data's
// `cachePrefix`; nullopt when both are empty (nothing is cached). The file stem is the prefix's
// base name ("memory" without one).
struct IndexCacheLocation {
  std::string directory;
  std::string stem;
};
std::optional<IndexCacheLocation> indexCacheLocation(const std::string& cacheDirectory, const std::string& cachePrefix);

// DIRECTORY/STEM.KIND-H.dgidx, H the 32 hex digits of XXH3-128(key).
std::string indexCachePath(const IndexCacheLocation& location, const std::string& kind, const std::string& key);

// Why arrays read back cannot be this key's index ("" when they can): the reader's own checks.
using IndexValidator = std::function<std::string(const IndexArrays&)>;

// The `arrayCount` arrays of the cache file `path` for `key`; nullopt when the file does not exist,
// or is corrupt (length, magic, checksum) or stale (another key, or `validate` refuses the arrays): then
// "PATH: REASON; rebuilding it" goes to `log` (when not null).
std::optional<IndexArrays> loadIndexCache(const std::string& path, const std::string& key, size_t arrayCount,
                                          const IndexValidator& validate, std::ostream* log);

// Writes the arrays atomically (support/AtomicFile.h), creating the directory. A failure to write
// (a read-only data directory) is reported on `log` and otherwise ignored: the index in memory is
// still right, only the next open builds it again.
void storeIndexCache(const std::string& path, const std::string& key, const IndexArrays& arrays, std::ostream* log);

// 16 hex digits of XXH3-64 over document lengths: all of the data that the index arrays depend on,
// folded into every key so a rewritten corpus never meets its old index.
std::string documentLengthsDigest(const std::vector<int64_t>& lengths);

}  // namespace dgemma
