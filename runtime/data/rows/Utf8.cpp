#include "runtime/data/rows/Utf8.h"

namespace dgemma {

std::optional<Utf8Problem> findInvalidUtf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // The number of continuation bytes, and the allowed range of the first one (which rules out
    // overlong forms, surrogates and code points above U+10FFFF in one check).
    size_t continuation = 0;
    unsigned char firstLow = 0x80, firstHigh = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      continuation = 1;
    } else if (lead == 0xE0) {
      continuation = 2;
      firstLow = 0xA0;
    } else if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) {
      continuation = 2;
    } else if (lead == 0xED) {
      continuation = 2;
      firstHigh = 0x9F;
    } else if (lead == 0xF0) {
      continuation = 3;
      firstLow = 0x90;
    } else if (lead >= 0xF1 && lead <= 0xF3) {
      continuation = 3;
    } else if (lead == 0xF4) {
      continuation = 3;
      firstHigh = 0x8F;
    } else {
      // 0x80..0xBF (stray continuation), 0xC0/0xC1 (always overlong), 0xF5..0xFF (out of range).
      return Utf8Problem{static_cast<int64_t>(i), lead};
    }
    for (size_t k = 1; k <= continuation; ++k) {
      if (i + k >= size) return Utf8Problem{static_cast<int64_t>(i), lead};
      const unsigned char b = bytes[i + k];
      const unsigned char low = k == 1 ? firstLow : 0x80;
      const unsigned char high = k == 1 ? firstHigh : 0xBF;
      if (b < low || b > high) return Utf8Problem{static_cast<int64_t>(i), lead};
    }
    i += continuation + 1;
  }
  return std::nullopt;
}

std::string describeUtf8Problem(const Utf8Problem& problem) {
  static const char* digits = "0123456789ABCDEF";
  const std::string hex = std::string("0x") + digits[problem.byte >> 4] + digits[problem.byte & 15];
  return "expected UTF-8 text, got the invalid byte " + hex + " at column " + std::to_string(problem.offset + 1);
}

}  // namespace dgemma
