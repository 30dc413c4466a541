// Strict base64 (RFC 4648, section 4, standard alphabet) for the data: URIs of image parts.
//
// Hand-written rather than taken from a library: it is a few lines, and an error must say at which
// offset the input is malformed, which general-purpose decoders do not report. Strict means: no
// whitespace or line breaks, no URL-safe alphabet, the length a multiple of 4, "=" padding only in
// the last group (one or two), and the bits the padding drops must be zero (so that every byte
// string has exactly one encoding).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dgemma::serve {

struct Base64Error {
  size_t offset = 0;    // byte offset in the encoded text
  std::string message;  // "expected a base64 character, got ' '"
};

// The decoded bytes, or the first error found.
std::optional<std::string> decodeBase64(std::string_view encoded, Base64Error& error);

std::string encodeBase64(std::string_view bytes);

}  // namespace dgemma::serve
