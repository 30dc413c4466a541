// Where the random draws of generation come from (docs/generation.md, "Randomness"). The default,
// CounterDrawSource, derives every draw from the run seed (GenerationKeys.h); a parity test replays
// a trace recorded from transformers instead (RecordedDraws.h).
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace dgemma {

// One decoder pass of one request: `step` counts the passes of the canvas from 0 (the pass with
// max_denoising_steps - step steps remaining).
struct DrawSite {
  int64_t request = 0;
  int64_t canvas = 0;
  int64_t step = 0;
};

class DrawSource {
 public:
  virtual ~DrawSource() = default;

  // The canvas a block starts from: fills `ids` (canvas_length of them, each in [0, V)).
  virtual void initialCanvas(int64_t request, int64_t canvas, std::span<int64_t> ids) = 0;
  // The ids a step writes at the positions it rejects: one per canvas position (only the rejected
  // ones are used, as transformers draws a whole canvas).
  virtual void renoiseIds(const DrawSite& site, std::span<int64_t> ids) = 0;
  // The key of the categorical draw the denoise entry makes (its sample_keys row).
  virtual std::array<int64_t, 2> sampleKey(const DrawSite& site) = 0;
  // A recorded trace's categorical draws in place of the device's: overwrites `sampled` and returns
  // true, or returns false to keep the device's.
  virtual bool replaceSampled(const DrawSite& site, std::span<int64_t> sampled) {
    (void)site;
    (void)sampled;
    return false;
  }
};

// Every draw from (seed, request, canvas, step, purpose), GenerationKeys.h.
class CounterDrawSource : public DrawSource {
 public:
  CounterDrawSource(uint64_t seed, int64_t vocabSize) : seed_(seed), vocabSize_(vocabSize) {}

  void initialCanvas(int64_t request, int64_t canvas, std::span<int64_t> ids) override;
  void renoiseIds(const DrawSite& site, std::span<int64_t> ids) override;
  std::array<int64_t, 2> sampleKey(const DrawSite& site) override;

 private:
  uint64_t seed_;
  int64_t vocabSize_;
};

}  // namespace dgemma
