#include "support/CheckedSize.h"

#include <cstdio>

namespace dgemma {

std::optional<int64_t> checkedMultiply(int64_t a, int64_t b) {
  int64_t product = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

std::optional<int64_t> checkedNumElements(const std::vector<int64_t>& shape) {
  // A zero dimension makes the product 0 however large the others are; it is still a valid shape.
  std::optional<int64_t> count = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    count = checkedMultiply(*count, dim);
    if (!count) return std::nullopt;
  }
  return count;
}

std::optional<int64_t> checkedTensorBytes(const std::vector<int64_t>& shape, int64_t elementBytes) {
  const std::optional<int64_t> count = checkedNumElements(shape);
  if (!count) return std::nullopt;
  return checkedMultiply(*count, elementBytes);
}

std::string formatBytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
  return text;
}

}  // namespace dgemma
