// What every libFuzzer target in fuzz/ shares (docs/fuzzing.md): the verdict on one input, and
// scratch files for parsers that read a path rather than bytes.
//
// Verdict: a parser may reject any input, but only as dgemma::Error (InputError, exit 2, or
// RuntimeError, exit 1): that is a clean rejection. Any other exception is a finding, reported with
// its type and message and then abort()ed so that libFuzzer saves the input; so are crashes,
// sanitizer reports, timeouts and running out of memory, which libFuzzer catches itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

namespace dgemma::fuzz {

// Runs `parse` on `bytes`; returns normally on success or a dgemma::Error, aborts on anything else.
void expectCleanVerdict(std::string_view bytes, void (*parse)(std::string_view bytes));

inline std::string_view asText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A directory of this process's own under $TMPDIR (or /dev/shm, which is faster, when it exists),
// created on first use and removed at exit.
const std::string& scratchDirectory();
// Writes `bytes` to scratchDirectory()/name, replacing what an earlier input left; returns the path.
std::string writeScratchFile(const std::string& name, std::string_view bytes);

// A file of the source tree (the bundled tokenizer, fixtures), from the DGEMMA_SOURCE_DIR the build
// compiles in.
std::string sourcePath(const std::string& relative);

}  // namespace dgemma::fuzz
