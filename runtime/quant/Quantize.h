// The frozen base's quantizers on host buffers: what the weight loader runs at load time (a bf16/f32
// checkpoint quantized into a plan's packed parameters), what the export runs to merge an adapter back,
// and what the kernels' tests compare against (docs/training.md, "Frozen low-precision base").
//
// int8: symmetric, per output channel (a row of the last dimension): scale = absmax(row) / 127 in f32,
//       code = the nearest integer to value / scale (ties to even), clamped to [-127, 127]; a row of
//       zeros has scale 0 and codes 0. Decoded as code * scale in f32.
// nf4:  bitsandbytes' NF4 with blocks of 64 consecutive elements of the row-major tensor: absmax per
//       block in f32; each element times (1 / max(absmax, 1e-38)), clamped to [-1, 1], takes the code
//       of the nearest table value, a value exactly halfway between two table values taking the lower
//       one (torch.bucketize over the f32 midpoints, as bitsandbytes' quantize_4bit does on CPU); two
//       codes per byte, the even element in the high nibble. Decoded as table[code] * absmax in f32.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/HostTensor.h"

namespace dgemma::quant {

enum class Format : uint8_t { Int8, Nf4 };

std::string_view formatName(Format format);                 // "int8", "nf4"
std::optional<Format> parseFormat(std::string_view name);   // nullopt for any other spelling

// `rows` rows of `width` elements each (width > 0): codes [rows, width], scales [rows].
void quantizeInt8(const float* values, int64_t rows, int64_t width, int8_t* codes, float* scales);
void dequantizeInt8(const int8_t* codes, const float* scales, int64_t rows, int64_t width, float* values);

// `count` elements, a multiple of kNf4BlockSize: codes count / 2 bytes, absmax count / 64.
void quantizeNf4(const float* values, int64_t count, uint8_t* codes, float* absmax);
void dequantizeNf4(const uint8_t* codes, const float* absmax, int64_t count, float* values);

// The shapes of a weight of logical shape `shape` in a format: the codes' (int8: the shape; nf4: the
// last dimension halved, u8) and the scales' (int8: without the last dimension; nf4: the last dimension
// over 64). Throws InputError naming `what` when the format cannot hold the shape (rank 0, nf4 with a
// last dimension that is not a multiple of 64).
std::vector<int64_t> codesShape(Format format, const std::vector<int64_t>& shape, const std::string& what);
std::vector<int64_t> scalesShape(Format format, const std::vector<int64_t>& shape, const std::string& what);
DType codesDType(Format format);  // i8 for int8, u8 for nf4

struct QuantizedTensor {
  HostTensor codes;
  HostTensor scales;  // int8: per-row scales; nf4: per-block absmax; f32 either way
};

// A floating tensor of any float dtype (widened to f32 first) quantized; its shape checked as above.
QuantizedTensor quantize(const HostTensor& values, Format format, const std::string& what);
// The f32 tensor of logical shape `shape` the codes and scales stand for.
HostTensor dequantize(const HostTensor& codes, const HostTensor& scales, Format format,
                      const std::vector<int64_t>& shape, const std::string& what);

}  // namespace dgemma::quant
