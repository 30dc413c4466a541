// Image loading and the Gemma 4 image processor (docs/data.md, "JSONL rows", "Image preprocessing").
//
// decodeImage reads PNG through libpng and JPEG through libjpeg, and converts to 8-bit RGB the way
// PIL's Image.convert("RGB") does: grayscale is replicated to three channels, alpha is dropped
// without compositing, palettes are expanded. Other formats are refused by name (docs/data.md,
// "JSONL rows").
//
// processGemma4Image reproduces HF transformers' default Gemma4ImageProcessor (the torchvision
// backend): aspect-preserving target size, torchvision resize(BICUBIC, antialias=True) on the uint8
// image (torch's CPU uint8 separable antialiased kernel: double weights from the Keys a = -0.5 cubic,
// quantized to int16 with one precision for the whole axis, integer accumulation with rounding and
// clamping, horizontal pass then vertical pass with a uint8 intermediate), rescale by float32(1/255),
// patchify and pad.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/HostTensor.h"

namespace dgemma {

struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;  // height * width * 3, row-major, RGB interleaved
};

// PIL's MAX_IMAGE_PIXELS (above it PIL warns of a decompression bomb): 268 MB as RGB. Checked
// against the header's size before any pixel is allocated.
constexpr int64_t kMaxImagePixels = 89'478'485;
// An image file larger than this is refused before it is read.
constexpr uint64_t kMaxImageFileBytes = uint64_t{512} << 20;

// Decodes the bytes of an image file; `source` names it in messages. Throws InputError
// "SOURCE: invalid PNG image: REASON" (truncated, corrupt, over kMaxImagePixels), "SOURCE: invalid
// JPEG image: REASON", or "SOURCE: expected a PNG or JPEG image, got a GIF image; ..." for anything
// else.
RgbImage decodeImageBytes(std::string_view bytes, const std::string& source);
// decodeImageBytes of the regular file `path` (at most kMaxImageFileBytes). Throws InputError as
// above or as support/InputFile.h's readRegularFile for a file that cannot be read ("PATH: cannot
// read: REASON", "PATH: expected a regular file, got a FIFO"); RuntimeError when reading fails.
RgbImage decodeImage(const std::string& path);

struct Gemma4ImageOptions {
  int64_t patchSize = 16;
  int64_t poolingKernelSize = 3;
  int64_t maxSoftTokens = 280;  // one of 70, 140, 280, 560, 1120, unless configuredSoftTokens
  // The budget is a model config's vision_soft_tokens_per_image (docs/data.md, "Image
  // preprocessing"): any positive count is the model's to choose (a small model's, e.g. the demo's
  // 9); without it only the processor's own set is accepted.
  bool configuredSoftTokens = false;
};

struct ProcessedImage {
  HostTensor pixelValues;       // f32 [maxSoftTokens * k^2, 3 * p * p], values in [0, 1], zero padding
  HostTensor imagePositionIds;  // i64 [maxSoftTokens * k^2, 2], (x = column, y = row), (-1, -1) padding
  int64_t numSoftTokens = 0;    // real patches / k^2
  int64_t resizedHeight = 0;
  int64_t resizedWidth = 0;
};

// The resize target (height, width) of docs/data.md, "Image preprocessing", for an image of height
// x width. Throws InputError for an empty image, for options outside the allowed set, and when the
// rule fails (a 0 x 0 target, or a target over the patch budget).
std::pair<int64_t, int64_t> gemma4TargetSize(int64_t height, int64_t width, const Gemma4ImageOptions& options = {});

// The soft tokens an image of height x width yields: its target size's patches / pooling^2. What
// processGemma4Image reports, without resizing (dataset validation needs only the count).
int64_t gemma4SoftTokenCount(int64_t height, int64_t width, const Gemma4ImageOptions& options = {});

// torch.nn.functional.interpolate(uint8, mode="bicubic", antialias=True, align_corners=False) on CPU.
// Returns the input unchanged when the size is unchanged. Throws InputError for empty sizes.
RgbImage resizeBicubicAntialias(const RgbImage& image, int64_t outHeight, int64_t outWidth);

ProcessedImage processGemma4Image(const RgbImage& image, const Gemma4ImageOptions& options = {});

}  // namespace dgemma
