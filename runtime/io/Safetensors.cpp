#include "runtime/io/Safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>

#include "support/AtomicFile.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

// The format stores little-endian integers and element data; reading them in place needs a
// little-endian host.
static_assert(std::endian::native == std::endian::little, "safetensors IO assumes a little-endian host");

namespace {

constexpr uint64_t kHeaderLengthBytes = 8;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
constexpr size_t kMaxRank = 16;  // dimensions of one tensor

struct SafetensorsDType {
  std::string_view name;
  DType dtype;
};
// Every dtype dgemma has. safetensors also defines I16, U16, U32, U64, F8_*, which dgemma has no
// type for; those are rejected by name.
constexpr SafetensorsDType kDTypes[] = {
    {"F64", DType::F64}, {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"I64", DType::I64},
    {"I32", DType::I32}, {"I8", DType::I8},   {"U8", DType::U8},   {"BOOL", DType::Bool},
};

std::optional<DType> dtypeFromSafetensorsName(std::string_view name) {
  for (const SafetensorsDType& entry : kDTypes)
    if (entry.name == name) return entry.dtype;
  return std::nullopt;
}

std::string_view safetensorsNameOf(DType dtype) {
  for (const SafetensorsDType& entry : kDTypes)
    if (entry.dtype == dtype) return entry.name;
  throw std::logic_error("DType without a safetensors name");
}

std::string supportedDTypeList() {
  std::string list;
  for (const SafetensorsDType& entry : kDTypes) list += (list.empty() ? "" : ", ") + std::string(entry.name);
  return list;
}

// Here and below, std::string("...") + rather than "..." + a temporary: GCC 12 at -O3 warns falsely
// (-Wrestrict) about the latter.
std::string rangeToString(uint64_t begin, uint64_t end) {
  return std::string("[") + std::to_string(begin) + "," + std::to_string(end) + "]";
}

// A name from a file, as a message shows it: as written when it is short, printable ASCII, escaped
// and cut otherwise (a header may hold megabytes of control characters in one key).
std::string shownName(const std::string& name) {
  constexpr size_t kMaxShown = 200;
  const bool plain = name.size() <= kMaxShown && std::all_of(name.begin(), name.end(), [](char c) {
                       return c >= 0x20 && c < 0x7f && c != '\'';
                     });
  return plain ? "'" + name + "'" : quoteForMessage(name, kMaxShown);
}

[[noreturn]] void failTensor(const std::string& path, const std::string& name, const std::string& what) {
  throw InputError(path + ": tensor " + shownName(name) + ": " + what);
}

// The writer's caller passed something that cannot be written: a bug, not bad input.
[[noreturn]] void rejectTensor(const std::string& path, const std::string& name, const std::string& what) {
  throw std::invalid_argument("writeSafetensors " + path + ": tensor '" + name + "': " + what);
}

// Checks one header entry against the data region and returns it with its byte range.
SafetensorsEntry parseEntry(const std::string& path, const std::string& name, const nlohmann::json& value,
                            uint64_t dataRegionBytes) {
  if (!value.is_object()) failTensor(path, name, "expected an object with dtype, shape and data_offsets");

  SafetensorsEntry entry;
  entry.name = name;

  auto dtypeField = value.find("dtype");
  if (dtypeField == value.end() || !dtypeField->is_string()) failTensor(path, name, "dtype: expected a string");
  const std::string& dtypeText = dtypeField->get_ref<const std::string&>();
  std::optional<DType> dtype = dtypeFromSafetensorsName(dtypeText);
  if (!dtype)
    failTensor(path, name,
               "dtype: '" + dtypeText + "' is not supported (expected one of " + supportedDTypeList() + ")");
  entry.dtype = *dtype;

  auto shapeField = value.find("shape");
  if (shapeField == value.end() || !shapeField->is_array())
    failTensor(path, name, "shape: expected an array of integers");
  if (shapeField->size() > kMaxRank)
    failTensor(path, name, "shape: " + std::to_string(shapeField->size()) + " dimensions, expected at most " +
                               std::to_string(kMaxRank));
  uint64_t expectedBytes = dtypeSize(entry.dtype);
  // The product of the non-zero dimensions: an empty tensor may not hide dimensions whose product
  // overflows either, since code that walks a shape multiplies its extents.
  uint64_t nonZeroBytes = dtypeSize(entry.dtype);
  for (size_t i = 0; i < shapeField->size(); ++i) {
    const nlohmann::json& dim = (*shapeField)[i];
    if (!dim.is_number_integer()) failTensor(path, name, "shape: expected an array of integers");
    if (!dim.is_number_unsigned())
      failTensor(path, name,
                 "shape: dimension " + std::to_string(i) + " is " + describeJsonValue(dim) +
                     ", expected a non-negative integer");
    uint64_t extent = dim.get<uint64_t>();
    if (extent > static_cast<uint64_t>(INT64_MAX) ||
        (extent != 0 && __builtin_mul_overflow(nonZeroBytes, extent, &nonZeroBytes)))
      failTensor(path, name, "shape: dimension " + std::to_string(i) + " (" + std::to_string(extent) +
                                 ") makes the tensor larger than 2^64 bytes");
    expectedBytes = extent == 0 ? 0 : expectedBytes * extent;  // cannot overflow: bounded by nonZeroBytes
    entry.shape.push_back(static_cast<int64_t>(extent));
  }

  auto offsetsField = value.find("data_offsets");
  if (offsetsField == value.end() || !offsetsField->is_array() || offsetsField->size() != 2 ||
      !(*offsetsField)[0].is_number_unsigned() || !(*offsetsField)[1].is_number_unsigned())
    failTensor(path, name, "data_offsets: expected [begin, end] with non-negative integers");
  uint64_t begin = (*offsetsField)[0].get<uint64_t>();
  uint64_t end = (*offsetsField)[1].get<uint64_t>();
  if (end < begin) failTensor(path, name, "data_offsets: " + rangeToString(begin, end) + ": end is before begin");
  if (end - begin != expectedBytes)
    failTensor(path, name,
               "data_offsets: " + rangeToString(begin, end) + " hold " + std::to_string(end - begin) + " bytes, but " +
                   dtypeText + " " + shapeToString(entry.shape) + " needs " + std::to_string(expectedBytes));
  if (end > dataRegionBytes)
    failTensor(path, name,
               "data_offsets: " + rangeToString(begin, end) + " extend beyond the data region (" +
                   std::to_string(dataRegionBytes) + " bytes)");
  entry.offset = begin;
  entry.bytes = end - begin;
  return entry;
}

std::map<std::string, std::string> parseMetadata(const std::string& path, const nlohmann::json& value) {
  const std::string expectation = path + ": " + std::string(kMetadataKey) + ": expected an object of string values";
  if (!value.is_object()) throw InputError(expectation);
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    if (!text.is_string()) throw InputError(expectation + " (" + shownName(key) + " is " + text.type_name() + ")");
    metadata.emplace(key, text.get<std::string>());
  }
  return metadata;
}

}  // namespace

SafetensorsHeader parseSafetensorsHeader(std::string_view fileBytes, const std::string& path) {
  SafetensorsHeader parsed;
  if (fileBytes.size() < kHeaderLengthBytes)
    throw InputError(path + ": header: the file is " + std::to_string(fileBytes.size()) +
                     " bytes, too short for the 8-byte header length");
  uint64_t headerBytes;
  std::memcpy(&headerBytes, fileBytes.data(), sizeof headerBytes);
  if (headerBytes > fileBytes.size() - kHeaderLengthBytes)
    throw InputError(path + ": header: length " + std::to_string(headerBytes) +
                     " extends beyond the end of the file (" + std::to_string(fileBytes.size()) + " bytes)");
  parsed.dataStart = kHeaderLengthBytes + headerBytes;
  const uint64_t dataRegionBytes = fileBytes.size() - parsed.dataStart;

  // JSON objects keep only the last of repeated keys; a repeated tensor name is ambiguous, so it is
  // caught while parsing. parseJson bounds the nesting (the parsed value's destructor recurses) and
  // refuses a NUL byte, which nlohmann's lexer would take for the end of the header.
  std::set<std::string> topLevelKeys;
  const nlohmann::json header = parseJson(std::string_view(fileBytes.data() + kHeaderLengthBytes, headerBytes),
                                          path + ": header", [&](const std::string& key) {
                                            if (!topLevelKeys.insert(key).second)
                                              failTensor(path, key, "appears twice in the header");
                                          });
  if (!header.is_object()) throw InputError(path + ": header: expected a JSON object, got " + describeJsonValue(header));

  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      parsed.metadata = parseMetadata(path, value);
      continue;
    }
    parsed.entries.push_back(parseEntry(path, name, value, dataRegionBytes));
  }

  // Stable, so that empty tensors sharing an offset stay in name order (the JSON object's order).
  std::stable_sort(parsed.entries.begin(), parsed.entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return std::tie(a.offset, a.bytes) < std::tie(b.offset, b.bytes);
                   });
  // Empty tensors own no bytes, so they cannot overlap anything.
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : parsed.entries) {
    if (entry.bytes == 0) continue;
    if (previous && entry.offset < previous->offset + previous->bytes)
      failTensor(path, entry.name,
                 "data_offsets " + rangeToString(entry.offset, entry.offset + entry.bytes) + " overlap tensor " +
                     shownName(previous->name) + " " + rangeToString(previous->offset, previous->offset + previous->bytes));
    previous = &entry;
  }
  return parsed;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;

  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before fstat could refuse it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw InputError(path + ": cannot open: not a regular file");
  }
  const uint64_t fileBytes = static_cast<uint64_t>(info.st_size);
  if (fileBytes < kHeaderLengthBytes) {
    ::close(fd);
    throw InputError(path + ": header: the file is " + std::to_string(fileBytes) +
                     " bytes, too short for the 8-byte header length");
  }
  void* mapping = ::mmap(nullptr, fileBytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmapErrno = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) throw RuntimeError(path + ": cannot map: " + std::strerror(mmapErrno));
  file.mapping_ = static_cast<const uint8_t*>(mapping);
  file.mappingBytes_ = fileBytes;

  SafetensorsHeader header =
      parseSafetensorsHeader(std::string_view(reinterpret_cast<const char*>(file.mapping_), fileBytes), path);
  file.dataStart_ = header.dataStart;
  file.entries_ = std::move(header.entries);
  file.metadata_ = std::move(header.metadata);
  for (size_t i = 0; i < file.entries_.size(); ++i) file.indexByName_.emplace(file.entries_[i].name, i);
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mappingBytes_(std::exchange(other.mappingBytes_, 0)),
      dataStart_(other.dataStart_),
      entries_(std::move(other.entries_)),
      indexByName_(std::move(other.indexByName_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mappingBytes_ = std::exchange(other.mappingBytes_, 0);
    dataStart_ = other.dataStart_;
    entries_ = std::move(other.entries_);
    indexByName_ = std::move(other.indexByName_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (mapping_) ::munmap(const_cast<uint8_t*>(mapping_), mappingBytes_);
  mapping_ = nullptr;
  mappingBytes_ = 0;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto found = indexByName_.find(name);
  return found == indexByName_.end() ? nullptr : &entries_[found->second];
}

const uint8_t* SafetensorsFile::data(const SafetensorsEntry& entry) const {
  return mapping_ + dataStart_ + entry.offset;
}

void SafetensorsFile::release(const SafetensorsEntry& entry) const {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = dataStart_ + entry.offset, end = begin + entry.bytes;
  const uint64_t firstPage = (begin + page - 1) / page * page, lastPage = end / page * page;
  // Pages shared with a neighbouring tensor stay: only whole pages inside the range are dropped.
  // Advice that fails changes nothing but the resident set, so its result is not checked.
  if (mapping_ && lastPage > firstPage)
    ::madvise(const_cast<uint8_t*>(mapping_) + firstPage, lastPage - firstPage, MADV_DONTNEED);
}

HostTensor SafetensorsFile::read(const std::string& name) const {
  const SafetensorsEntry* entry = find(name);
  if (!entry) failTensor(path_, name, "not found");
  HostTensor tensor(entry->dtype, entry->shape);
  if (entry->bytes) std::memcpy(tensor.data.data(), data(*entry), entry->bytes);
  return tensor;
}

namespace {

// The length prefix and JSON header of a file holding `tensors` (name, dtype, shape) back to back in
// the order given, padded with spaces to a multiple of 8 bytes so that the data region starts aligned
// for 8-byte element types. Throws std::invalid_argument for a reserved or repeated name, a negative
// extent or a name that is not UTF-8.
std::string headerPrefix(const std::string& path, const std::vector<StreamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const StreamedTensor& tensor : tensors) {
    if (tensor.name == kMetadataKey) rejectTensor(path, tensor.name, "the name is reserved for metadata");
    if (!names.insert(tensor.name).second) rejectTensor(path, tensor.name, "the name appears twice");
    for (int64_t extent : tensor.shape)
      if (extent < 0) rejectTensor(path, tensor.name, "negative dimension in shape " + shapeToString(tensor.shape));
    const uint64_t bytes = streamedTensorBytes(tensor);
    header[tensor.name] = {{"dtype", safetensorsNameOf(tensor.dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string headerText;
  try {
    headerText = header.dump();
  } catch (const nlohmann::json::type_error& error) {
    throw std::invalid_argument("writeSafetensors " + path + ": a name or metadata value is not UTF-8: " + error.what());
  }
  headerText.append((8 - headerText.size() % 8) % 8, ' ');
  std::string prefix(kHeaderLengthBytes, '\0');
  const uint64_t headerBytes = headerText.size();
  std::memcpy(prefix.data(), &headerBytes, sizeof headerBytes);
  return prefix + headerText;
}

}  // namespace

uint64_t streamedTensorBytes(const StreamedTensor& tensor) {
  uint64_t elements = 1;
  for (int64_t extent : tensor.shape) elements *= static_cast<uint64_t>(extent);
  return elements * dtypeSize(tensor.dtype);
}

void writeSafetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<StreamedTensor> layout;
  std::vector<std::string_view> pieces(1);  // pieces[0] is the header, filled in below
  for (const auto& [name, tensor] : tensors) {
    if (!tensor) rejectTensor(path, name, "null tensor");
    layout.push_back({name, tensor->dtype, tensor->shape, nullptr});
    for (int64_t extent : tensor->shape)
      if (extent < 0) rejectTensor(path, name, "negative dimension in shape " + shapeToString(tensor->shape));
    const uint64_t bytes = streamedTensorBytes(layout.back());
    if (tensor->data.size() != bytes)
      rejectTensor(path, name,
                   "holds " + std::to_string(tensor->data.size()) + " bytes, but its shape needs " + std::to_string(bytes));
    pieces.emplace_back(reinterpret_cast<const char*>(tensor->data.data()), bytes);
  }
  const std::string prefix = headerPrefix(path, layout, metadata);
  pieces[0] = prefix;
  writePiecesAtomically(path, pieces);
}

std::string safetensorsBytes(const std::string& what,
                             const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<StreamedTensor> layout;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor) rejectTensor(what, name, "null tensor");
    layout.push_back({name, tensor->dtype, tensor->shape, nullptr});
    for (int64_t extent : tensor->shape)
      if (extent < 0) rejectTensor(what, name, "negative dimension in shape " + shapeToString(tensor->shape));
    const uint64_t bytes = streamedTensorBytes(layout.back());
    if (tensor->data.size() != bytes)
      rejectTensor(
          what, name,
          "holds " + std::to_string(tensor->data.size()) + " bytes, but its shape needs " + std::to_string(bytes));
  }
  std::string file = headerPrefix(what, layout, metadata);
  for (const auto& [name, tensor] : tensors)
    file.append(reinterpret_cast<const char*>(tensor->data.data()), tensor->data.size());
  return file;
}

void writeSafetensorsStreamed(const std::string& path, const std::vector<StreamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  for (const StreamedTensor& tensor : tensors)
    if (!tensor.fill) rejectTensor(path, tensor.name, "no fill callback");
  const std::string prefix = headerPrefix(path, tensors, metadata);
  AtomicFileWriter file(path);
  file.append(prefix);
  for (const StreamedTensor& tensor : tensors) {
    std::vector<uint8_t> bytes(streamedTensorBytes(tensor));
    tensor.fill(bytes.data());
    file.append(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
  file.commit();
}

SafetensorsDirectory SafetensorsDirectory::open(const std::string& path) {
  namespace fs = std::filesystem;
  SafetensorsDirectory directory;
  directory.path_ = path;

  std::error_code statusError;
  fs::file_status status = fs::status(path, statusError);
  if (statusError || !fs::exists(status)) throw InputError(path + ": no such file or directory");

  if (!fs::is_directory(status)) {
    directory.files_.push_back(SafetensorsFile::open(path));
    const SafetensorsFile& file = directory.files_.back();
    for (size_t i = 0; i < file.entries().size(); ++i)
      directory.locationByName_.emplace(file.entries()[i].name, EntryIndex{0, i});
    return directory;
  }

  const fs::path indexPath = fs::path(path) / kIndexFileName;
  if (fs::exists(indexPath)) {
    const std::string indexName = indexPath.string();
    const nlohmann::json index = parseJson(readWholeFile(indexName), indexName);
    auto weightMap = index.is_object() ? index.find("weight_map") : index.end();
    if (weightMap == index.end() || !weightMap->is_object())
      throw InputError(indexName + ": weight_map: expected an object mapping tensor names to file names");

    std::map<std::string, size_t> fileIndexByShard;
    for (const auto& [name, shard] : weightMap->items()) {
      if (!shard.is_string())
        throw InputError(indexName + ": weight_map: tensor " + shownName(name) + ": expected a file name, got " +
                         describeJsonValue(shard));
      const std::string& shardName = shard.get_ref<const std::string&>();
      // A shard is a file beside the index: a path elsewhere would read files the checkpoint does not hold.
      if (shardName.empty() || shardName.find('/') != std::string::npos || shardName == "." || shardName == "..")
        throw InputError(indexName + ": weight_map: tensor " + shownName(name) + ": expected a file name in " + path +
                         ", got " + quoteForMessage(shardName, 120));
      auto [known, inserted] = fileIndexByShard.emplace(shardName, directory.files_.size());
      if (inserted) directory.files_.push_back(SafetensorsFile::open((fs::path(path) / shardName).string()));
      const SafetensorsFile& file = directory.files_[known->second];
      const SafetensorsEntry* entry = file.find(name);
      if (!entry)
        throw InputError(indexName + ": weight_map: tensor " + shownName(name) + ": mapped to " + shownName(shardName) +
                         ", which does not contain it");
      directory.locationByName_.emplace(name,
                                        EntryIndex{known->second, static_cast<size_t>(entry - file.entries().data())});
    }
    return directory;
  }

  std::vector<fs::path> shardPaths;
  for (const fs::directory_entry& child : fs::directory_iterator(path))
    if (child.is_regular_file() && child.path().extension() == ".safetensors") shardPaths.push_back(child.path());
  if (shardPaths.empty())
    throw InputError(path + ": no .safetensors files and no " + std::string(kIndexFileName) + " in the directory");
  std::sort(shardPaths.begin(), shardPaths.end());

  for (const fs::path& shardPath : shardPaths) {
    const size_t fileIndex = directory.files_.size();
    directory.files_.push_back(SafetensorsFile::open(shardPath.string()));
    const SafetensorsFile& file = directory.files_.back();
    for (size_t i = 0; i < file.entries().size(); ++i) {
      const std::string& name = file.entries()[i].name;
      auto [existing, inserted] = directory.locationByName_.emplace(name, EntryIndex{fileIndex, i});
      if (!inserted)
        failTensor(path, name,
                   "in both " + fs::path(directory.files_[existing->second.file].path()).filename().string() + " and " +
                       shardPath.filename().string());
    }
  }
  return directory;
}

std::vector<std::string> SafetensorsDirectory::names() const {
  std::vector<std::string> names;
  names.reserve(locationByName_.size());
  for (const auto& [name, location] : locationByName_) names.push_back(name);
  return names;
}

std::optional<SafetensorsLocation> SafetensorsDirectory::find(const std::string& name) const {
  auto found = locationByName_.find(name);
  if (found == locationByName_.end()) return std::nullopt;
  const SafetensorsFile& file = files_[found->second.file];
  return SafetensorsLocation{&file, &file.entries()[found->second.entry]};
}

HostTensor SafetensorsDirectory::read(const std::string& name) const {
  std::optional<SafetensorsLocation> location = find(name);
  if (!location) failTensor(path_, name, "not found");
  return location->file->read(name);
}

}  // namespace dgemma
