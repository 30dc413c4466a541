#include "runtime/generate/DenoisingBatch.h"

#include <algorithm>

#include "runtime/generate/EntropyBoundAcceptance.h"
#include "support/Error.h"

namespace dgemma {

DenoisingBatch::DenoisingBatch(const GenerationSettings& settings, int64_t rows)
    : entropyBound_(settings.entropyBound), rows_(rows), canvasLength_(settings.canvasLength) {
  if (canvasLength_ < 1) throw InputError("generation: canvas_length: expected >= 1, got " + std::to_string(canvasLength_));
  stopRules_.assign(rows, StopRule(settings.stabilityThreshold, settings.confidenceThreshold, canvasLength_));
  frozen_.assign(rows, 1);
  canvas_.assign(rows * canvasLength_, 0);
  argmax_ = canvas_;
  passes_.assign(rows, 0);
}

void DenoisingBatch::startCanvas(const std::vector<uint8_t>& takesPart, std::vector<int64_t> initialCanvases) {
  if (static_cast<int64_t>(takesPart.size()) != rows_ || static_cast<int64_t>(initialCanvases.size()) != rows_ * canvasLength_)
    throw RuntimeError("DenoisingBatch::startCanvas: expected " + std::to_string(rows_) + " rows of " +
                       std::to_string(canvasLength_) + " ids");
  for (int64_t row = 0; row < rows_; ++row) {
    frozen_[row] = takesPart[row] ? 0 : 1;
    stopRules_[row].reset();
  }
  canvas_ = std::move(initialCanvases);
  argmax_ = canvas_;
  std::fill(passes_.begin(), passes_.end(), 0);
}

bool DenoisingBatch::allFrozen() const {
  return std::all_of(frozen_.begin(), frozen_.end(), [](uint8_t frozen) { return frozen != 0; });
}

std::vector<uint8_t> DenoisingBatch::applyPass(std::span<const int64_t> sampled, std::span<const int64_t> argmax,
                                               std::span<const float> entropy, const RenoiseDraw& renoise) {
  const size_t cells = static_cast<size_t>(rows_ * canvasLength_);
  if (sampled.size() != cells || argmax.size() != cells || entropy.size() != cells)
    throw RuntimeError("DenoisingBatch::applyPass: expected " + std::to_string(cells) + " values per output");
  std::vector<uint8_t> accepted(cells, 0);
  std::vector<int64_t> renoiseIds(canvasLength_);
  for (int64_t row = 0; row < rows_; ++row) {
    const size_t begin = static_cast<size_t>(row * canvasLength_);
    std::span<int64_t> canvas(canvas_.data() + begin, canvasLength_);
    std::span<int64_t> argmaxCanvas(argmax_.data() + begin, canvasLength_);
    std::span<const float> rowEntropy = entropy.subspan(begin, canvasLength_);
    if (frozen_[row]) {
      // transformers feeds the stop rule the frozen argmax; the row stays finished whatever it says.
      stopRules_[row].updateStable(argmaxCanvas);
      continue;
    }
    ++passes_[row];
    const std::vector<uint8_t> rowAccepted = entropyBoundAccept(rowEntropy, entropyBound_);
    renoise(row, renoiseIds);
    for (int64_t position = 0; position < canvasLength_; ++position) {
      accepted[begin + position] = rowAccepted[position];
      canvas[position] = rowAccepted[position] ? sampled[begin + position] : renoiseIds[position];
    }
    std::copy(argmax.begin() + begin, argmax.begin() + begin + canvasLength_, argmaxCanvas.begin());
    if (stopRules_[row].shouldStop(argmaxCanvas, rowEntropy)) frozen_[row] = 1;
  }
  return accepted;
}

}  // namespace dgemma
