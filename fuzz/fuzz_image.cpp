// libFuzzer target: image decoding (docs/data.md, "JSONL rows", "Image preprocessing"): any bytes
// as an image file, decoded as the data pipeline does (PNG through libpng, JPEG through libjpeg,
// anything else through stb_image), then the Gemma 4 soft-token count dataset validation asks for.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz/FuzzSupport.h"
#include "runtime/data/image/Image.h"

namespace {

// The parser under test.
void decodeImageBytes(std::string_view bytes) {
  const std::string path = dgemma::fuzz::writeScratchFile("image", bytes);
  dgemma::RgbImage image = dgemma::decodeImage(path);
  if (image.pixels.size() != static_cast<size_t>(image.width * image.height * 3)) {
    std::fprintf(stderr, "==fuzz finding: decoded %lldx%lld image holds %zu bytes\n", static_cast<long long>(image.width),
                 static_cast<long long>(image.height), image.pixels.size());
    std::abort();
  }
  (void)dgemma::gemma4SoftTokenCount(image.height, image.width);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), decodeImageBytes);
  return 0;
}
