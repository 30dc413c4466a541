// The plan container. Layout (all integers little-endian):
//   0  char[8] magic "DGEMMAPL"
//   8  u32 format version
//  12  u32 flags (0)
//  16  u64 header bytes (H)
//  24  u64 section bytes (S)
//  32  u64 XXH3-64 of every byte from offset 48 to the end
//  40  u64 reserved (0)
//  48  JSON header (H bytes), zero padding to a multiple of 64, then the sections (S bytes)
#include <xxhash.h>

#include <cstring>

#include "support/Error.h"
#include "support/Json.h"
#include "support/AtomicFile.h"
#include "plan/PlanFile.h"

namespace dgemma {

namespace {

constexpr char kMagic[8] = {'D', 'G', 'E', 'M', 'M', 'A', 'P', 'L'};
constexpr size_t kPreambleBytes = 48;
constexpr uint64_t kSectionAlignment = 64;

uint64_t alignUp(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

void putU32(std::string& out, size_t at, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
void putU64(std::string& out, size_t at, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
uint64_t getUnsigned(const std::string& in, size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return value;
}

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

std::string unreadVersionMessage(uint64_t version) {
  if (version < kPlanFormatVersion)
    return "plan format version " + std::to_string(version) + " is no longer read; recompile with dgemma-compile";
  return "plan format version " + std::to_string(version) + " is not supported (this dgemma reads version " +
         std::to_string(kPlanFormatVersion) + "); recompile the plan with this dgemma-compile";
}

std::string serializePlan(const Plan& plan) {
  nlohmann::json header = planToJson(plan);
  nlohmann::json sections = nlohmann::json::array();
  uint64_t sectionBytes = 0;
  for (const BinarySection& section : plan.sections) {
    sectionBytes = alignUp(sectionBytes, kSectionAlignment);
    sections.push_back({{"name", section.name}, {"offset", sectionBytes}, {"bytes", section.data.size()}});
    sectionBytes += section.data.size();
  }
  header["sections"] = sections;
  std::string headerText = header.dump();

  uint64_t sectionsStart = alignUp(kPreambleBytes + headerText.size(), kSectionAlignment);
  std::string out(sectionsStart + sectionBytes, '\0');
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  putU32(out, 8, plan.version);
  putU64(out, 16, headerText.size());
  putU64(out, 24, sectionBytes);
  std::memcpy(out.data() + kPreambleBytes, headerText.data(), headerText.size());
  for (size_t i = 0; i < plan.sections.size(); ++i) {
    uint64_t offset = sections[i]["offset"].get<uint64_t>();
    if (!plan.sections[i].data.empty())
      std::memcpy(out.data() + sectionsStart + offset, plan.sections[i].data.data(), plan.sections[i].data.size());
  }
  putU64(out, 32, XXH3_64bits(out.data() + kPreambleBytes, out.size() - kPreambleBytes));
  return out;
}

Plan deserializePlan(const std::string& bytes, const std::string& source) {
  auto fail = [&](const std::string& message) -> void { throw InputError(source + ": " + message); };
  if (bytes.size() < kPreambleBytes)
    fail("truncated: " + std::to_string(bytes.size()) + " bytes, a plan file has at least " + std::to_string(kPreambleBytes));
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) fail("not a dgemma plan file (bad magic)");
  uint64_t version = getUnsigned(bytes, 8, 4);
  if (version != kPlanFormatVersion) fail(unreadVersionMessage(version));
  uint64_t headerBytes = getUnsigned(bytes, 16, 8);
  uint64_t sectionBytes = getUnsigned(bytes, 24, 8);
  // Sizes above 2^62 cannot be real and would overflow the arithmetic below.
  if (headerBytes > (uint64_t{1} << 62) || sectionBytes > (uint64_t{1} << 62)) fail("corrupt preamble: impossible section sizes");
  uint64_t sectionsStart = alignUp(kPreambleBytes + headerBytes, kSectionAlignment);
  if (sectionsStart + sectionBytes != bytes.size())
    fail("truncated or extended: the preamble declares " + std::to_string(sectionsStart + sectionBytes) + " bytes, the file has " +
         std::to_string(bytes.size()));
  // Written as 0 and kept for later formats: a reader of this version knows no meaning for
  // another value, so it must not guess one.
  if (const uint64_t flags = getUnsigned(bytes, 12, 4); flags != 0)
    fail("preamble flags (byte 12): expected 0, got " + std::to_string(flags));
  if (const uint64_t reserved = getUnsigned(bytes, 40, 8); reserved != 0)
    fail("preamble reserved field (byte 40): expected 0, got " + std::to_string(reserved));
  uint64_t storedHash = getUnsigned(bytes, 32, 8);
  uint64_t actualHash = XXH3_64bits(bytes.data() + kPreambleBytes, bytes.size() - kPreambleBytes);
  if (storedHash != actualHash)
    fail("content hash mismatch (stored " + hex(storedHash) + ", computed " + hex(actualHash) +
         "): the file is corrupted or was edited");

  const nlohmann::json header =
      parseJson(std::string_view(bytes).substr(kPreambleBytes, headerBytes), source + ": header");
  Plan plan = planFromJson(header, source);

  if (!header.contains("sections") || !header["sections"].is_array()) fail("sections: missing");
  for (size_t i = 0; i < header["sections"].size(); ++i) {
    const nlohmann::json& entry = header["sections"][i];
    std::string where = "sections[" + std::to_string(i) + "]";
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("offset") ||
        !entry["offset"].is_number_unsigned() || !entry.contains("bytes") || !entry["bytes"].is_number_unsigned())
      fail(where + ": expected {\"name\": string, \"offset\": unsigned, \"bytes\": unsigned}");
    uint64_t offset = entry["offset"].get<uint64_t>();
    uint64_t size = entry["bytes"].get<uint64_t>();
    if (offset > sectionBytes || size > sectionBytes - offset) fail(where + ": range leaves the section area");
    BinarySection section;
    section.name = entry["name"].get<std::string>();
    section.data.assign(bytes.begin() + sectionsStart + offset, bytes.begin() + sectionsStart + offset + size);
    plan.sections.push_back(std::move(section));
  }
  validatePlan(plan, source);
  return plan;
}

void writePlanFile(const Plan& plan, const std::string& path) { writeFileAtomically(path, serializePlan(plan)); }

Plan readPlanFile(const std::string& path) { return deserializePlan(readWholeFile(path), path); }

std::string planFileForRank(const std::string& planDir, int64_t rank) {
  return planDir + "/rank-" + std::to_string(rank) + ".dgplan";
}

}  // namespace dgemma
