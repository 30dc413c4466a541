#include "runtime/data/pretrain/IndexCache.h"

#include <xxhash.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "support/AtomicFile.h"
#include "support/Error.h"

namespace dgemma {

namespace fs = std::filesystem;

namespace {

// The file's integers are written as the host holds them; the format says little-endian.
static_assert(std::endian::native == std::endian::little, "index caches are read and written little-endian");

constexpr std::string_view kMagic = "DGIDX001";

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

void appendU64(std::string& out, uint64_t value) { out.append(reinterpret_cast<const char*>(&value), sizeof value); }

// Reads the file's fields in order; every read checks that the bytes are there.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : bytes_(bytes) {}
  bool take(size_t count, std::string_view& out) {
    if (count > bytes_.size() - position_) return false;
    out = bytes_.substr(position_, count);
    position_ += count;
    return true;
  }
  bool takeU64(uint64_t& value) {
    std::string_view raw;
    if (!take(sizeof value, raw)) return false;
    std::memcpy(&value, raw.data(), sizeof value);
    return true;
  }
  bool atEnd() const { return position_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t position_ = 0;
};

// The arrays of a file whose checksum has been verified; "" or why the layout is wrong.
std::string parseArrays(std::string_view body, const std::string& key, size_t arrayCount, IndexArrays& arrays) {
  Cursor cursor(body);
  std::string_view magic, storedKey;
  uint64_t keyBytes = 0, count = 0;
  if (!cursor.take(kMagic.size(), magic) || magic != kMagic) return "not an index cache (bad magic)";
  if (!cursor.takeU64(keyBytes) || !cursor.take(keyBytes, storedKey)) return "truncated key";
  if (storedKey != key) return "stale: built for another dataset definition";
  if (!cursor.takeU64(count) || count != arrayCount)
    return "expected " + std::to_string(arrayCount) + " arrays, got " + std::to_string(count);
  arrays.assign(arrayCount, {});
  for (std::vector<int64_t>& array : arrays) {
    uint64_t length = 0;
    std::string_view raw;
    if (!cursor.takeU64(length) || length > body.size() / sizeof(int64_t) ||
        !cursor.take(length * sizeof(int64_t), raw))
      return "truncated array";
    array.resize(length);
    std::memcpy(array.data(), raw.data(), raw.size());
  }
  if (!cursor.atEnd()) return "trailing bytes after the arrays";
  return "";
}

}  // namespace

std::optional<IndexCacheLocation> indexCacheLocation(const std::string& cacheDirectory,
                                                     const std::string& cachePrefix) {
  const std::string stem = cachePrefix.empty() ? "memory" : fs::path(cachePrefix).filename().string();
  if (!cacheDirectory.empty()) return IndexCacheLocation{cacheDirectory, stem};
  if (cachePrefix.empty()) return std::nullopt;
  const std::string directory = fs::path(cachePrefix).parent_path().string();
  return IndexCacheLocation{directory.empty() ? "." : directory, stem};
}

std::string indexCachePath(const IndexCacheLocation& location, const std::string& kind, const std::string& key) {
  const XXH128_hash_t hash = XXH3_128bits(key.data(), key.size());
  return (fs::path(location.directory) /
          (location.stem + "." + kind + "-" + hex64(hash.high64) + hex64(hash.low64) + ".dgidx"))
      .string();
}

std::optional<IndexArrays> loadIndexCache(const std::string& path, const std::string& key, size_t arrayCount,
                                          const IndexValidator& validate, std::ostream* log) {
  std::error_code error;
  if (!fs::exists(path, error)) return std::nullopt;
  auto reject = [&](const std::string& reason) -> std::optional<IndexArrays> {
    if (log) *log << path << ": " << reason << "; rebuilding it\n";
    return std::nullopt;
  };
  std::string bytes;
  try {
    bytes = readWholeFile(path);
  } catch (const Error& e) {
    return reject(std::string("unreadable (") + e.what() + ")");
  }
  uint64_t storedChecksum = 0;
  if (bytes.size() < kMagic.size() + 2 * sizeof(uint64_t))
    return reject("truncated (" + std::to_string(bytes.size()) + " bytes)");
  const std::string_view body(bytes.data(), bytes.size() - sizeof storedChecksum);
  std::memcpy(&storedChecksum, bytes.data() + body.size(), sizeof storedChecksum);
  if (XXH3_64bits(body.data(), body.size()) != storedChecksum) return reject("corrupt (checksum mismatch)");
  IndexArrays arrays;
  if (const std::string problem = parseArrays(body, key, arrayCount, arrays); !problem.empty()) return reject(problem);
  if (const std::string problem = validate(arrays); !problem.empty()) return reject("stale: " + problem);
  return arrays;
}

void storeIndexCache(const std::string& path, const std::string& key, const IndexArrays& arrays, std::ostream* log) {
  std::string header(kMagic);
  appendU64(header, key.size());
  header += key;
  appendU64(header, arrays.size());
  std::vector<std::string> lengths(arrays.size());
  std::vector<std::string_view> pieces = {header};
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, header.data(), header.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    appendU64(lengths[i], arrays[i].size());
    const std::string_view values(reinterpret_cast<const char*>(arrays[i].data()), arrays[i].size() * sizeof(int64_t));
    pieces.push_back(lengths[i]);
    pieces.push_back(values);
    XXH3_64bits_update(state, lengths[i].data(), lengths[i].size());
    XXH3_64bits_update(state, values.data(), values.size());
  }
  std::string checksum;
  appendU64(checksum, XXH3_64bits_digest(state));
  XXH3_freeState(state);
  pieces.push_back(checksum);
  try {
    createOutputDirectory(fs::path(path).parent_path().string(), "index cache directory");
    writePiecesAtomically(path, pieces);
  } catch (const RuntimeError& e) {
    if (log) *log << "cannot cache the index (" << e.what() << "); it is kept in memory only\n";
  }
}

std::string documentLengthsDigest(const std::vector<int64_t>& lengths) {
  return hex64(XXH3_64bits(lengths.data(), lengths.size() * sizeof(int64_t)));
}

}  // namespace dgemma
