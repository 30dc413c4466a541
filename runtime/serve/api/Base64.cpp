#include "runtime/serve/api/Base64.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace dgemma::serve {
namespace {

constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> makeDecodeTable() {
  std::array<int8_t, 256> table{};
  for (auto& value : table) value = -1;
  for (size_t i = 0; i < kAlphabet.size(); ++i) table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}
constexpr std::array<int8_t, 256> kDecodeTable = makeDecodeTable();

std::string describeByte(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x21 && byte < 0x7f) return std::string("'") + c + "'";
  static const char* kHex = "0123456789abcdef";
  return std::string("byte 0x") + kHex[byte >> 4] + kHex[byte & 15];
}

}  // namespace

std::optional<std::string> decodeBase64(std::string_view encoded, Base64Error& error) {
  auto fail = [&](size_t offset, std::string message) {
    error = {offset, std::move(message)};
    return std::nullopt;
  };
  if (encoded.size() % 4 != 0) {
    return fail(encoded.size(), "expected a length that is a multiple of 4, got " + std::to_string(encoded.size()) +
                                    " characters (is the data truncated?)");
  }
  std::string bytes;
  bytes.reserve(encoded.size() / 4 * 3);
  for (size_t group = 0; group < encoded.size(); group += 4) {
    const bool last = group + 4 == encoded.size();
    uint32_t bits = 0;
    int padding = 0;
    for (size_t i = 0; i < 4; ++i) {
      const char c = encoded[group + i];
      if (c == '=') {
        // Padding fills the last one or two characters of the last group.
        if (!last || i < 2) return fail(group + i, "unexpected '=' padding before the end of the data");
        ++padding;
        bits <<= 6;
        continue;
      }
      if (padding > 0) return fail(group + i, "expected '=' after '=' padding, got " + describeByte(c));
      const int8_t value = kDecodeTable[static_cast<uint8_t>(c)];
      if (value < 0)
        return fail(group + i, "expected a base64 character (A-Z, a-z, 0-9, '+', '/'), got " + describeByte(c));
      bits = bits << 6 | static_cast<uint32_t>(value);
    }
    const uint32_t droppedBits = padding == 2 ? bits & 0xffff : padding == 1 ? bits & 0xff : 0;
    if (droppedBits != 0) {
      return fail(group + 3 - padding, "expected the bits before '=' padding to be zero (non-canonical base64)");
    }
    bytes.push_back(static_cast<char>(bits >> 16));
    if (padding < 2) bytes.push_back(static_cast<char>(bits >> 8 & 0xff));
    if (padding < 1) bytes.push_back(static_cast<char>(bits & 0xff));
  }
  return bytes;
}

std::string encodeBase64(std::string_view bytes) {
  std::string encoded;
  encoded.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t bits = 0;
    for (size_t k = 0; k < 3; ++k) bits = bits << 8 | (k < n ? static_cast<uint8_t>(bytes[i + k]) : 0);
    for (size_t k = 0; k < 4; ++k) encoded.push_back(k <= n ? kAlphabet[bits >> (18 - 6 * k) & 63] : '=');
  }
  return encoded;
}

}  // namespace dgemma::serve
