#include "runtime/data/text/Utf8Replacement.h"

#include <cstddef>

namespace dgemma {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// The length of the UTF-8 sequence whose lead byte is `lead`, and the range its second byte must be
// in (the first continuation byte's range excludes overlong forms, surrogates and values above
// U+10FFFF; RFC 3629's table); 0 if `lead` starts no sequence.
struct Lead {
  size_t length;
  unsigned char secondLow, secondHigh;
};

Lead leadOf(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

std::string replaceInvalidUtf8(std::string_view bytes) {
  std::string text;
  text.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Lead lead = leadOf(static_cast<unsigned char>(bytes[pos]));
    // How many bytes from `pos` fit the sequence `lead` starts: all of them when it is well formed,
    // else the maximal subpart to replace (at least the lead byte).
    size_t fitting = lead.length == 0 ? 0 : 1;
    while (fitting < lead.length && pos + fitting < bytes.size()) {
      const auto b = static_cast<unsigned char>(bytes[pos + fitting]);
      const bool fits = fitting == 1 ? b >= lead.secondLow && b <= lead.secondHigh : b >= 0x80 && b <= 0xBF;
      if (!fits) break;
      ++fitting;
    }
    if (lead.length != 0 && fitting == lead.length) {
      text.append(bytes.substr(pos, fitting));
    } else {
      text.append(kReplacementCharacter);
      fitting = fitting == 0 ? 1 : fitting;
    }
    pos += fitting;
  }
  return text;
}

}  // namespace dgemma
