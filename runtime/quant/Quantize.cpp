#include "runtime/quant/Quantize.h"

#include <algorithm>
#include <cmath>

#include "runtime/quant/Nf4Table.h"
#include "support/Error.h"
#include "support/Shape.h"

namespace dgemma::quant {
namespace {

// The 15 decision boundaries between neighbouring table values, halfway between them in f32, as
// bitsandbytes computes them before torch.bucketize.
struct Nf4Midpoints {
  float values[15];
  constexpr Nf4Midpoints() : values{} {
    for (int i = 0; i < 15; ++i) values[i] = (kNf4Table[i] + kNf4Table[i + 1]) / 2.0f;
  }
};
constexpr Nf4Midpoints kMidpoints;

// torch.bucketize(x, midpoints) with right=False: the number of midpoints strictly below x, so a value
// exactly on a midpoint takes the lower code.
uint8_t nf4CodeOf(float scaled) {
  uint8_t code = 0;
  while (code < 15 && kMidpoints.values[code] < scaled) ++code;
  return code;
}

int64_t product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t result = 1;
  for (size_t i = begin; i < end; ++i) result *= shape[i];
  return result;
}

void checkShape(Format format, const std::vector<int64_t>& shape, const std::string& what) {
  if (shape.empty() || shape.back() <= 0)
    throw InputError(what + ": a " + std::string(formatName(format)) +
                     " weight needs a rank >= 1 shape with a positive last dimension, got " + shapeToString(shape));
  if (format == Format::Nf4 && shape.back() % kNf4BlockSize != 0)
    throw InputError(what + ": nf4 quantizes blocks of " + std::to_string(kNf4BlockSize) +
                     " elements within a row, so the last dimension must be a multiple of " +
                     std::to_string(kNf4BlockSize) + "; the shape is " + shapeToString(shape));
}

}  // namespace

std::string_view formatName(Format format) { return format == Format::Int8 ? "int8" : "nf4"; }

std::optional<Format> parseFormat(std::string_view name) {
  if (name == "int8") return Format::Int8;
  if (name == "nf4") return Format::Nf4;
  return std::nullopt;
}

void quantizeInt8(const float* values, int64_t rows, int64_t width, int8_t* codes, float* scales) {
  for (int64_t row = 0; row < rows; ++row) {
    const float* in = values + row * width;
    int8_t* out = codes + row * width;
    float absmax = 0.0f;
    for (int64_t i = 0; i < width; ++i) absmax = std::max(absmax, std::fabs(in[i]));
    const float scale = absmax / 127.0f;
    scales[row] = scale;
    for (int64_t i = 0; i < width; ++i) {
      // nearbyint rounds ties to even under the default rounding mode, as torch.round does.
      const float code = scale == 0.0f ? 0.0f : std::nearbyint(in[i] / scale);
      out[i] = static_cast<int8_t>(std::clamp(code, -127.0f, 127.0f));
    }
  }
}

void dequantizeInt8(const int8_t* codes, const float* scales, int64_t rows, int64_t width, float* values) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t i = 0; i < width; ++i)
      values[row * width + i] = static_cast<float>(codes[row * width + i]) * scales[row];
}

void quantizeNf4(const float* values, int64_t count, uint8_t* codes, float* absmax) {
  for (int64_t block = 0; block < count / kNf4BlockSize; ++block) {
    const float* in = values + block * kNf4BlockSize;
    float blockMax = 0.0f;
    for (int64_t i = 0; i < kNf4BlockSize; ++i) blockMax = std::max(blockMax, std::fabs(in[i]));
    absmax[block] = blockMax;
    // A reciprocal then a product, both rounded in f32 (torch's `x * (1.0 / absmax)`), not a division.
    const float reciprocal = 1.0f / std::max(blockMax, 1e-38f);
    uint8_t* out = codes + block * kNf4BlockSize / 2;
    for (int64_t i = 0; i < kNf4BlockSize; i += 2) {
      const uint8_t high = nf4CodeOf(std::clamp(in[i] * reciprocal, -1.0f, 1.0f));
      const uint8_t low = nf4CodeOf(std::clamp(in[i + 1] * reciprocal, -1.0f, 1.0f));
      out[i / 2] = static_cast<uint8_t>(high << 4 | low);
    }
  }
}

void dequantizeNf4(const uint8_t* codes, const float* absmax, int64_t count, float* values) {
  for (int64_t i = 0; i < count; ++i) values[i] = kNf4Table[nf4CodeAt(codes, i)] * absmax[i / kNf4BlockSize];
}

std::vector<int64_t> codesShape(Format format, const std::vector<int64_t>& shape, const std::string& what) {
  checkShape(format, shape, what);
  std::vector<int64_t> result = shape;
  if (format == Format::Nf4) result.back() /= 2;
  return result;
}

std::vector<int64_t> scalesShape(Format format, const std::vector<int64_t>& shape, const std::string& what) {
  checkShape(format, shape, what);
  std::vector<int64_t> result = shape;
  if (format == Format::Int8) result.pop_back();
  else result.back() /= kNf4BlockSize;
  return result;
}

DType codesDType(Format format) { return format == Format::Int8 ? DType::I8 : DType::U8; }

QuantizedTensor quantize(const HostTensor& values, Format format, const std::string& what) {
  const HostTensor wide = convertDType(values, DType::F32, what);
  QuantizedTensor result{HostTensor(codesDType(format), codesShape(format, values.shape, what)),
                         HostTensor(DType::F32, scalesShape(format, values.shape, what))};
  if (format == Format::Int8) {
    const int64_t width = values.shape.back();
    quantizeInt8(wide.as<float>(), product(values.shape, 0, values.shape.size() - 1), width, result.codes.as<int8_t>(),
                 result.scales.as<float>());
  } else {
    quantizeNf4(wide.as<float>(), wide.numElements(), result.codes.as<uint8_t>(), result.scales.as<float>());
  }
  return result;
}

HostTensor dequantize(const HostTensor& codes, const HostTensor& scales, Format format,
                      const std::vector<int64_t>& shape, const std::string& what) {
  const std::vector<int64_t> expectedCodes = codesShape(format, shape, what);
  const std::vector<int64_t> expectedScales = scalesShape(format, shape, what);
  if (codes.dtype != codesDType(format) || codes.shape != expectedCodes)
    throw InputError(what + ": " + std::string(formatName(format)) + " codes: expected " +
                     std::string(dtypeName(codesDType(format))) + " " + shapeToString(expectedCodes) + ", got " +
                     std::string(dtypeName(codes.dtype)) + " " + shapeToString(codes.shape));
  if (scales.dtype != DType::F32 || scales.shape != expectedScales)
    throw InputError(what + ": " + std::string(formatName(format)) + " scales: expected f32 " +
                     shapeToString(expectedScales) + ", got " + std::string(dtypeName(scales.dtype)) + " " +
                     shapeToString(scales.shape));
  HostTensor result(DType::F32, shape);
  if (format == Format::Int8)
    dequantizeInt8(codes.as<int8_t>(), scales.as<float>(), product(shape, 0, shape.size() - 1), shape.back(),
                   result.as<float>());
  else dequantizeNf4(codes.as<uint8_t>(), scales.as<float>(), result.numElements(), result.as<float>());
  return result;
}

}  // namespace dgemma::quant
