// Invalid UTF-8 in text to encode or decode (docs/data.md, "Tokenization"): every tokenizer backend
// sees the text as Python's `bytes.decode("utf-8", errors="replace")` would give it, which is what a
// Python caller of HF's tokenizers hands them (HF takes str, not bytes), so dgemma and HF agree on
// the ids of any byte string.
#pragma once

#include <string>
#include <string_view>

namespace dgemma {

// `bytes` with each maximal ill-formed subpart replaced by U+FFFD (Unicode's "substitution of maximal
// subparts", which CPython's and Rust's lossy UTF-8 decoders both implement): a lead byte and the
// continuation bytes that could still belong to it count as one subpart, any other invalid byte is
// a subpart of its own. Well-formed text comes back unchanged.
std::string replaceInvalidUtf8(std::string_view bytes);

}  // namespace dgemma
