// libFuzzer target: a safetensors file (runtime/io/Safetensors.h): the 8-byte length, the JSON
// header, every entry's dtype, shape and byte range; then every listed tensor is read, which the
// header validation promises cannot fail.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz/FuzzSupport.h"
#include "runtime/io/Safetensors.h"
#include "support/Error.h"

namespace {

// The parser under test.
void openSafetensors(std::string_view bytes) {
  const std::string path = dgemma::fuzz::writeScratchFile("model.safetensors", bytes);
  dgemma::SafetensorsFile file = dgemma::SafetensorsFile::open(path);
  for (const dgemma::SafetensorsEntry& entry : file.entries()) {
    try {
      (void)file.read(entry.name);
    } catch (const dgemma::Error& error) {
      std::fprintf(stderr, "==fuzz finding: a listed tensor does not read: %s\n", error.what());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), openSafetensors);
  return 0;
}
