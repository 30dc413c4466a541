#include "runtime/data/pretrain/DocumentSplit.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "support/Error.h"

namespace dgemma {

const char* splitPartName(SplitPart part) {
  switch (part) {
    case SplitPart::Train: return "train";
    case SplitPart::Validation: return "validation";
    case SplitPart::Test: return "test";
  }
  return "?";
}

SplitWeights parseSplit(const std::string& text) {
  // Megatron takes ',' or else '/' as the separator.
  const char separator = text.find(',') != std::string::npos ? ',' : '/';
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    items.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (items.size() > 3)
    throw InputError("--split: '" + text + "': expected at most 3 weights (train, validation, test), got " +
                     std::to_string(items.size()));
  SplitWeights split;
  split.weights = {0, 0, 0};
  double sum = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    double value = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || error != std::errc() || end != item.data() + item.size() || !std::isfinite(value) || value < 0)
      throw InputError("--split: item " + std::to_string(i + 1) + " ('" + item + "'): expected a number >= 0");
    split.weights[i] = value;
    sum += value;
  }
  if (!(sum > 0)) throw InputError("--split: '" + text + "': expected at least one weight above 0");
  return split;
}

std::string formatSplit(const SplitWeights& split) {
  std::string text;
  for (size_t i = 0; i < split.weights.size(); ++i) {
    char buffer[32];
    const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, split.weights[i]);
    (void)error;  // 32 characters hold any double's shortest form
    if (i > 0) text += ',';
    text.append(buffer, end);
  }
  return text;
}

std::array<DocumentRange, 3> splitDocumentRanges(const SplitWeights& split, int64_t documents) {
  const double sum = split.weights[0] + split.weights[1] + split.weights[2];
  // nearbyint rounds half to even under the default rounding mode, as Python's round does. The
  // running sum can end a hair above 1; no part reaches past the last document.
  auto boundary = [&](double fraction) {
    return std::min(documents, static_cast<int64_t>(std::nearbyint(fraction * static_cast<double>(documents))));
  };
  std::array<DocumentRange, 3> ranges;
  double start = 0;
  for (int part = 0; part < 3; ++part) {
    const double end = start + split.weights[part] / sum;
    // megatron-core builds no dataset for a part whose running sum does not grow.
    ranges[part] =
        end <= start ? DocumentRange{boundary(start), boundary(start)} : DocumentRange{boundary(start), boundary(end)};
    start = end;
  }
  return ranges;
}

}  // namespace dgemma
