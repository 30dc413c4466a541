// CLI11 checks for numeric flags that say the allowed range in a short, readable message
// ("--micro-batch: expected an integer in [1, 65536], got \"1099511627776\"") and run on the
// flag's text before CLI11 converts it: a value outside the type (a 300-digit number, -1 for an
// unsigned seed) is refused instead of wrapped, clamped or printed in full. docs/cli.md lists the
// range of every flag.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "support/Json.h"

namespace dgemma {

namespace flag_ranges_detail {

inline std::string shown(const std::string& text) { return quoteForMessage(text, 40); }

inline std::string formatNumber(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace flag_ranges_detail

// A decimal integer in [minimum, maximum].
inline CLI::Validator integerIn(int64_t minimum, int64_t maximum) {
  const std::string range = "[" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]";
  return CLI::Validator(
      [minimum, maximum, range](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error != std::errc() || stop != end || value < minimum || value > maximum)
          return "expected an integer in " + range + ", got " + flag_ranges_detail::shown(text);
        return "";
      },
      "INT in " + range);
}

// A decimal integer in [0, 2^64 - 1], the whole range of an unsigned 64-bit value (seeds, steps of
// noise keys): "-1" is refused rather than wrapped.
inline CLI::Validator anyUnsigned64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error != std::errc() || stop != end)
          return "expected an integer in [0, 18446744073709551615], got " + flag_ranges_detail::shown(text);
        return "";
      },
      "UINT64");
}

// A finite number between minimum and maximum; each end is included unless said otherwise.
inline CLI::Validator numberIn(double minimum, double maximum, bool includesMinimum = true, bool includesMaximum = true) {
  const std::string range = std::string(includesMinimum ? "[" : "(") + flag_ranges_detail::formatNumber(minimum) + ", " +
                            flag_ranges_detail::formatNumber(maximum) + (includesMaximum ? "]" : ")");
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* stop = nullptr;
        const double value = text.empty() ? 0.0 : std::strtod(text.c_str(), &stop);
        const bool parsed = !text.empty() && stop == text.c_str() + text.size() && std::isfinite(value);
        const bool aboveMinimum = includesMinimum ? value >= minimum : value > minimum;
        const bool belowMaximum = includesMaximum ? value <= maximum : value < maximum;
        if (!parsed || !aboveMinimum || !belowMaximum)
          return "expected a number in " + range + ", got " + flag_ranges_detail::shown(text);
        return "";
      },
      "NUMBER in " + range);
}

}  // namespace dgemma
