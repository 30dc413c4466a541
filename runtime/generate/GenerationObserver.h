// What a Generator reports while it runs (docs/generation.md, "Observing a generation"): every
// denoising pass and every committed canvas of each micro-batch. The visual terminal mode of
// `dgemma-run generate` and the parity tests against transformers' traces are observers.
//
// The spans cover the micro-batch's real requests only (rows x canvas_length, row-major; rows that
// pad a short batch are left out) and are valid during the call.
#pragma once

#include <cstdint>
#include <span>

namespace dgemma {

struct DenoisePassReport {
  int64_t canvas = 0;        // the block index, from 0
  int64_t step = 0;          // the pass within the canvas, from 0
  int64_t remaining = 0;     // n: the steps remaining, max_denoising_steps - step (transformers' cur_step)
  float temperature = 0;     // T of this pass
  int64_t canvasLength = 0;
  std::span<const int64_t> requests;  // the request id of each row
  std::span<const int64_t> sampled;   // the categorical draws used (recorded ones when replayed)
  std::span<const int64_t> argmax;    // the decoder's argmax (frozen rows: as the decoder computed it)
  std::span<const float> entropy;
  std::span<const uint8_t> accepted;  // 1 where the new sample was taken (0 on frozen rows)
  std::span<const int64_t> newCanvas;  // the canvas after the pass (frozen rows: unchanged)
  std::span<const uint8_t> frozen;    // per row: frozen during this pass
  std::span<const uint8_t> done;      // per row: frozen after it (finished denoising)
};

struct CanvasCommitReport {
  int64_t canvas = 0;
  int64_t canvasLength = 0;
  std::span<const int64_t> requests;
  std::span<const int64_t> tokens;     // the committed argmax canvas after the EOS rule
  std::span<const int64_t> passes;     // per row: the decoder passes that counted for it
  std::span<const uint8_t> finished;   // per row: finished (by this canvas's EOS or an earlier one)
};

class GenerationObserver {
 public:
  virtual ~GenerationObserver() = default;
  virtual void onDenoisePass(const DenoisePassReport& report) { (void)report; }
  virtual void onCanvasCommitted(const CanvasCommitReport& report) { (void)report; }
};

}  // namespace dgemma
