// Sizes computed from numbers a user controls (config fields, flags, plan and safetensors headers):
// every product and sum checked for overflow, and a bound on what one tensor may occupy, so that a
// shape from a file is refused before anything is built or allocated for it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dgemma {

// Larger than any one tensor dgemma could hold on one machine (1 TiB), small enough that every byte
// count and offset built from such tensors stays far from int64 overflow.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 40;

// a * b and a + b for a, b >= 0; nullopt when the result exceeds int64 (or an operand is negative).
std::optional<int64_t> checkedMultiply(int64_t a, int64_t b);
std::optional<int64_t> checkedAdd(int64_t a, int64_t b);
// The product of `shape`; nullopt when a dimension is negative or the product overflows.
std::optional<int64_t> checkedNumElements(const std::vector<int64_t>& shape);
// The bytes of a tensor of `shape` with `elementBytes`-byte elements; nullopt as above.
std::optional<int64_t> checkedTensorBytes(const std::vector<int64_t>& shape, int64_t elementBytes);

// "3.0 GiB", "512 bytes": a byte count for a message.
std::string formatBytes(uint64_t bytes);

}  // namespace dgemma
