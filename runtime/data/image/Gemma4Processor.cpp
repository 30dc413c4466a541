// The Gemma 4 image processor (docs/data.md, "Image preprocessing"), matching HF transformers'
// Gemma4ImageProcessor (torchvision backend) on CPU: see Image.h for the numerics.
#include <algorithm>
#include <cmath>

#include "support/Error.h"
#include "runtime/data/image/Image.h"

namespace dgemma {
namespace {

// Keys cubic convolution with a = -0.5 (the antialiased "bicubic" filter of torch and PIL).
double cubicFilter(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// The taps of one axis: for output i, `size[i]` int16 weights starting at input index `start[i]`.
struct AxisWeights {
  std::vector<int64_t> start;
  std::vector<int64_t> size;
  std::vector<int32_t> weights;  // outSize * maxTaps, int16 values
  int64_t maxTaps = 0;
  int precision = 0;
};

AxisWeights computeAxisWeights(int64_t inSize, int64_t outSize) {
  AxisWeights axis;
  const double scale = static_cast<double>(inSize) / static_cast<double>(outSize);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double invScale = scale >= 1.0 ? 1.0 / scale : 1.0;
  axis.maxTaps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  axis.start.resize(outSize);
  axis.size.resize(outSize);
  std::vector<double> real(size_t(outSize * axis.maxTaps), 0.0);
  double maxWeight = 0.0;
  for (int64_t i = 0; i < outSize; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t(0));
    int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), inSize) - xmin;
    xsize = std::clamp(xsize, int64_t(0), axis.maxTaps);
    double* w = real.data() + i * axis.maxTaps;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = cubicFilter((static_cast<double>(j + xmin) - center + 0.5) * invScale);
      total += w[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < xsize; ++j) {
        w[j] /= total;
        maxWeight = std::max(maxWeight, w[j]);
      }
    }
    axis.start[i] = xmin;
    axis.size[i] = xsize;
  }
  // The largest precision (< 22) at which the biggest weight still fits int16 after doubling.
  int precision = 0;
  for (precision = 0; precision < 22; ++precision) {
    const int next = static_cast<int>(0.5 + maxWeight * static_cast<double>(1 << (precision + 1)));
    if (next >= (1 << 15)) break;
  }
  axis.precision = precision;
  axis.weights.resize(real.size());
  for (size_t k = 0; k < real.size(); ++k) {
    const double v = real[k] * static_cast<double>(1 << precision);
    axis.weights[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return axis;
}

uint8_t roundAndClamp(int32_t sum, int precision) {
  const int32_t value = sum >> precision;  // arithmetic shift (C++20)
  return static_cast<uint8_t>(std::clamp(value, int32_t(0), int32_t(255)));
}

}  // namespace

std::pair<int64_t, int64_t> gemma4TargetSize(int64_t height, int64_t width, const Gemma4ImageOptions& options) {
  const int64_t soft = options.maxSoftTokens;
  if (options.configuredSoftTokens ? soft < 1 : soft != 70 && soft != 140 && soft != 280 && soft != 560 && soft != 1120) {
    throw InputError(std::string("gemma4 image processor: max_soft_tokens must be ") +
                     (options.configuredSoftTokens ? "positive" : "one of 70, 140, 280, 560, 1120") + ", got " +
                     std::to_string(soft));
  }
  if (options.patchSize <= 0 || options.poolingKernelSize <= 0) {
    throw InputError("gemma4 image processor: patch size and pooling kernel size must be positive");
  }
  if (height <= 0 || width <= 0) {
    throw InputError("gemma4 image processor: cannot resize an empty image (" + std::to_string(height) + " x " +
                     std::to_string(width) + ")");
  }
  const int64_t p = options.patchSize;
  const int64_t k = options.poolingKernelSize;
  const int64_t maxPatches = soft * k * k;
  const int64_t targetPx = maxPatches * p * p;
  const double factor = std::sqrt(static_cast<double>(targetPx) / static_cast<double>(height * width));
  const double idealHeight = factor * static_cast<double>(height);
  const double idealWidth = factor * static_cast<double>(width);
  const int64_t side = k * p;
  int64_t th = static_cast<int64_t>(std::floor(idealHeight / static_cast<double>(side))) * side;
  int64_t tw = static_cast<int64_t>(std::floor(idealWidth / static_cast<double>(side))) * side;
  if (th == 0 && tw == 0) {
    throw InputError("gemma4 image processor: resizing " + std::to_string(height) + " x " + std::to_string(width) +
                     " gives a 0 x 0 image");
  }
  const int64_t maxSide = (maxPatches / (k * k)) * side;
  if (th == 0) {
    th = side;
    tw = std::min(static_cast<int64_t>(std::floor(static_cast<double>(width) / static_cast<double>(height))) * side,
                  maxSide);
  } else if (tw == 0) {
    tw = side;
    th = std::min(static_cast<int64_t>(std::floor(static_cast<double>(height) / static_cast<double>(width))) * side,
                  maxSide);
  }
  if (th * tw > targetPx) {
    throw InputError("gemma4 image processor: resizing " + std::to_string(height) + " x " + std::to_string(width) +
                     " to " + std::to_string(th) + " x " + std::to_string(tw) + " exceeds " +
                     std::to_string(maxPatches) + " patches");
  }
  return {th, tw};
}

RgbImage resizeBicubicAntialias(const RgbImage& image, int64_t outHeight, int64_t outWidth) {
  if (image.width <= 0 || image.height <= 0 || outHeight <= 0 || outWidth <= 0) {
    throw InputError("image resize: empty input or output size");
  }
  if (outHeight == image.height && outWidth == image.width) return image;
  RgbImage current = image;
  if (outWidth != current.width) {  // horizontal pass first, as torch does
    const AxisWeights axis = computeAxisWeights(current.width, outWidth);
    const int32_t rounding = int32_t(1) << (axis.precision - 1);
    RgbImage next;
    next.width = outWidth;
    next.height = current.height;
    next.pixels.resize(size_t(next.width * next.height * 3));
    for (int64_t y = 0; y < current.height; ++y) {
      const uint8_t* row = current.pixels.data() + y * current.width * 3;
      uint8_t* out = next.pixels.data() + y * outWidth * 3;
      for (int64_t x = 0; x < outWidth; ++x) {
        const int32_t* w = axis.weights.data() + x * axis.maxTaps;
        const uint8_t* src = row + axis.start[x] * 3;
        for (int c = 0; c < 3; ++c) {
          int32_t sum = rounding;
          for (int64_t j = 0; j < axis.size[x]; ++j) sum += w[j] * int32_t(src[j * 3 + c]);
          out[x * 3 + c] = roundAndClamp(sum, axis.precision);
        }
      }
    }
    current = std::move(next);
  }
  if (outHeight != current.height) {
    const AxisWeights axis = computeAxisWeights(current.height, outHeight);
    const int32_t rounding = int32_t(1) << (axis.precision - 1);
    const int64_t rowValues = current.width * 3;
    RgbImage next;
    next.width = current.width;
    next.height = outHeight;
    next.pixels.resize(size_t(next.width * next.height * 3));
    std::vector<int32_t> sums(static_cast<size_t>(rowValues));
    for (int64_t y = 0; y < outHeight; ++y) {
      std::fill(sums.begin(), sums.end(), rounding);
      const int32_t* w = axis.weights.data() + y * axis.maxTaps;
      for (int64_t j = 0; j < axis.size[y]; ++j) {
        const uint8_t* src = current.pixels.data() + (axis.start[y] + j) * rowValues;
        const int32_t weight = w[j];
        for (int64_t v = 0; v < rowValues; ++v) sums[v] += weight * int32_t(src[v]);
      }
      uint8_t* out = next.pixels.data() + y * rowValues;
      for (int64_t v = 0; v < rowValues; ++v) out[v] = roundAndClamp(sums[v], axis.precision);
    }
    current = std::move(next);
  }
  return current;
}

int64_t gemma4SoftTokenCount(int64_t height, int64_t width, const Gemma4ImageOptions& options) {
  const auto [th, tw] = gemma4TargetSize(height, width, options);
  const int64_t k = options.poolingKernelSize;
  return (th / options.patchSize) * (tw / options.patchSize) / (k * k);
}

ProcessedImage processGemma4Image(const RgbImage& image, const Gemma4ImageOptions& options) {
  const auto [th, tw] = gemma4TargetSize(image.height, image.width, options);
  if (image.pixels.size() != size_t(image.width * image.height * 3)) {
    throw InputError("gemma4 image processor: pixel buffer does not match the image size");
  }
  const RgbImage resized = resizeBicubicAntialias(image, th, tw);
  const int64_t p = options.patchSize;
  const int64_t k = options.poolingKernelSize;
  const int64_t maxPatches = options.maxSoftTokens * k * k;
  const int64_t ph = th / p;
  const int64_t pw = tw / p;
  const int64_t numPatches = ph * pw;
  const int64_t patchValues = 3 * p * p;

  ProcessedImage out;
  out.resizedHeight = th;
  out.resizedWidth = tw;
  out.numSoftTokens = gemma4SoftTokenCount(image.height, image.width, options);
  out.pixelValues = HostTensor(DType::F32, {maxPatches, patchValues});
  out.imagePositionIds = HostTensor(DType::I64, {maxPatches, 2});
  float* values = out.pixelValues.as<float>();
  int64_t* positions = out.imagePositionIds.as<int64_t>();
  std::fill(values, values + maxPatches * patchValues, 0.0f);
  std::fill(positions, positions + maxPatches * 2, int64_t(-1));
  const float inv255 = static_cast<float>(1.0 / 255.0);  // the float32 scalar torch multiplies by
  for (int64_t n = 0; n < numPatches; ++n) {
    const int64_t row = n / pw;
    const int64_t col = n % pw;
    positions[n * 2] = col;
    positions[n * 2 + 1] = row;
    float* dst = values + n * patchValues;
    for (int64_t py = 0; py < p; ++py) {
      const uint8_t* src = resized.pixels.data() + ((row * p + py) * tw + col * p) * 3;
      for (int64_t v = 0; v < p * 3; ++v) dst[py * p * 3 + v] = static_cast<float>(src[v]) * inv255;
    }
  }
  return out;
}

}  // namespace dgemma
