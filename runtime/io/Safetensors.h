// The safetensors checkpoint format: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}),
// then the data region, which the offsets index into. Files are memory-mapped, so opening a large
// checkpoint costs only the header parse; tensors are copied out one at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/DType.h"
#include "runtime/core/HostTensor.h"

namespace dgemma {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the data region
  uint64_t bytes = 0;
};

// What a safetensors header says, checked against the file it came from.
struct SafetensorsHeader {
  uint64_t dataStart = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries;  // in data order, as SafetensorsFile::entries
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a safetensors file whose bytes (all of them: the length, the
// header and the data region) are `fileBytes`: nesting bounded as in support/Json.h, every entry's
// dtype, shape (no overflow) and byte range, no repeated names, no overlaps. Throws InputError
// naming `path`. SafetensorsFile::open runs exactly this on its mapping (and the fuzz target on
// arbitrary bytes).
SafetensorsHeader parseSafetensorsHeader(std::string_view fileBytes, const std::string& path);

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the whole header (every entry's dtype, shape and byte range,
  // and that no two ranges overlap), so that reading a listed tensor cannot fail. Throws InputError
  // "PATH: tensor 'NAME': ..." (or "PATH: header: ..." for problems not tied to one tensor).
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // In data order (ascending offset), which for files from writeSafetensors is the order written
  // (empty tensors at one offset excepted: those are in name order).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The entry's bytes inside the mapping; valid while this object lives. Not necessarily aligned
  // for the element type: copy before reading elements in place.
  const uint8_t* data(const SafetensorsEntry& entry) const;
  // Drops the entry's pages from this process's resident set (madvise MADV_DONTNEED on the whole
  // pages inside its range): a streaming reader calls it once a tensor is copied out, so that reading
  // a 52 GB checkpoint does not leave 52 GB of file pages counted as resident. The mapping stays
  // valid (a later read pages the bytes in again).
  void release(const SafetensorsEntry& entry) const;
  // A copy of the tensor. Throws InputError "PATH: tensor 'NAME': not found".
  HostTensor read(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  void unmap();

  std::string path_;
  const uint8_t* mapping_ = nullptr;
  uint64_t mappingBytes_ = 0;
  uint64_t dataStart_ = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> indexByName_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` in the order given, header padded with spaces to a multiple of 8 bytes (so the
// data region starts aligned), through a temporary file that is fsync'd and renamed over `path`:
// on failure the target is untouched and no temporary file remains (RuntimeError). Duplicate or
// reserved ("__metadata__") names, null tensors, or a tensor whose data size disagrees with its
// shape throw std::invalid_argument before anything is written.
void writeSafetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The bytes writeSafetensors would write, in memory (a small file that goes out through another
// writer, e.g. a checkpoint's extra files); `what` names the file in errors. Throws as writeSafetensors.
std::string safetensorsBytes(const std::string& what,
                             const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// A tensor of writeSafetensorsStreamed: its header entry, and what produces its bytes.
struct StreamedTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  // Fills exactly streamedTensorBytes() bytes when the writer reaches the tensor.
  std::function<void(uint8_t* bytes)> fill;
};
uint64_t streamedTensorBytes(const StreamedTensor& tensor);

// The same file as writeSafetensors, with the tensors produced one at a time: the header first
// (from the names, dtypes and shapes), then each tensor's bytes as its `fill` writes them into a
// buffer of that one tensor's size, freed before the next. At most one tensor's bytes are in memory,
// so a 5 GB shard of a 52 GB checkpoint costs no more than its largest tensor. Atomic as
// writeSafetensors (an exception from `fill` leaves nothing at `path`).
void writeSafetensorsStreamed(const std::string& path, const std::vector<StreamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Where a tensor lives in a SafetensorsDirectory; both pointers stay valid while it lives.
struct SafetensorsLocation {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

// A checkpoint spread over one or more safetensors files, addressed by tensor name.
class SafetensorsDirectory {
 public:
  // `path` is one of:
  //  - a directory with model.safetensors.index.json ({"weight_map": {name: shard file}}): the shards
  //    it names are opened and each name must be in the shard it is mapped to;
  //  - a directory without an index: every *.safetensors file in it, and a name may appear only once;
  //  - a single safetensors file.
  // Throws InputError naming the path (and the tensor, for a tensor problem).
  static SafetensorsDirectory open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return locationByName_.count(name) != 0; }
  std::optional<SafetensorsLocation> find(const std::string& name) const;
  // Throws InputError "PATH: tensor 'NAME': not found".
  HostTensor read(const std::string& name) const;

 private:
  struct EntryIndex {
    size_t file = 0;
    size_t entry = 0;
  };

  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, EntryIndex> locationByName_;
};

}  // namespace dgemma
