// The host's side of one micro-batch's canvas while it denoises (docs/generation.md, "The algorithm"):
// per row the current canvas, the argmax canvas, the stop rule and whether the row has finished
// denoising. It takes the decoder's per-position outputs of each pass and decides acceptance,
// renoising and stopping; it knows nothing of the model.
//
// A row that has finished denoising is frozen, as in transformers' batched loop
// (`_denoising_step`): its argmax canvas and current canvas stay (and the denoise entry keeps its
// self-conditioning logits, the `frozen` input), and the stop rule is still fed the frozen argmax,
// which keeps its history moving. Rows that take no part in a canvas (finished by an earlier
// canvas's EOS, or padding a short batch) are frozen from its start and never count a pass.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "plan/Plan.h"
#include "runtime/generate/StopRule.h"

namespace dgemma {

class DenoisingBatch {
 public:
  // `settings.maxDenoisingSteps` is the run's step budget (after any override).
  DenoisingBatch(const GenerationSettings& settings, int64_t rows);

  int64_t rows() const { return rows_; }
  int64_t canvasLength() const { return canvasLength_; }

  // Starts a canvas from `initialCanvases` (rows x canvas_length ids). The argmax canvas starts as
  // the initial canvas (transformers' `argmax_canvas = current_canvas`).
  void startCanvas(const std::vector<uint8_t>& takesPart, std::vector<int64_t> initialCanvases);

  // Fills the ids a row's rejected positions get at the current pass (called for unfrozen rows).
  using RenoiseDraw = std::function<void(int64_t row, std::span<int64_t> ids)>;

  // Applies one decoder pass (all rows x canvas_length, row-major): rows not yet finished take the
  // entropy-bound acceptance of `sampled`, renoise the rest and take `argmax`; then every row's
  // stop rule sees its (possibly frozen) argmax, and unfrozen rows that are stable and confident
  // finish. Returns the acceptance mask (all 0 on frozen rows).
  std::vector<uint8_t> applyPass(std::span<const int64_t> sampled, std::span<const int64_t> argmax,
                                 std::span<const float> entropy, const RenoiseDraw& renoise);

  // Rows frozen for the next pass (finished denoising, or taking no part): the `frozen` input.
  const std::vector<uint8_t>& frozen() const { return frozen_; }
  bool allFrozen() const;
  const std::vector<int64_t>& canvas() const { return canvas_; }
  const std::vector<int64_t>& argmaxCanvas() const { return argmax_; }
  // Decoder passes that counted for `row` in this canvas (those it was not frozen for).
  int64_t passes(int64_t row) const { return passes_[row]; }

 private:
  double entropyBound_;
  int64_t rows_, canvasLength_;
  std::vector<StopRule> stopRules_;
  std::vector<uint8_t> frozen_;
  std::vector<int64_t> canvas_, argmax_, passes_;
};

}  // namespace dgemma
