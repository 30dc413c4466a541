// Strict UTF-8 validation of one JSONL line (docs/data.md, "JSONL rows": rows are UTF-8).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dgemma {

// Where a byte string stops being well-formed UTF-8.
struct Utf8Problem {
  int64_t offset = 0;     // 0-based byte offset of the first invalid byte
  unsigned char byte = 0; // the value of that byte
};

// Validates `text` strictly (RFC 3629): no overlong forms, no surrogates (U+D800..U+DFFF), nothing
// above U+10FFFF, no truncated sequences, no stray continuation bytes. Returns the first problem, or
// nothing when the text is valid. A truncated or broken multi-byte sequence is reported at its lead
// byte; a stray continuation byte, or a lead byte that can never start a sequence, at itself.
std::optional<Utf8Problem> findInvalidUtf8(std::string_view text);

// "expected UTF-8 text, got the invalid byte 0xFF at column 3" (1-based column), as messages say it.
std::string describeUtf8Problem(const Utf8Problem& problem);

}  // namespace dgemma
