// A DrawSource that replays recorded draws (docs/generation.md, "Replaying recorded draws"): the
// initial canvases, the renoise ids and the categorical samples of a transformers generation, so
// that dgemma's sampler can be compared with it decision by decision.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "runtime/generate/DrawSource.h"

namespace dgemma {

class RecordedDraws : public DrawSource {
 public:
  // Records the draws of one request (its id in the generation), canvas and step (0-based pass).
  void setInitialCanvas(int64_t request, int64_t canvas, std::vector<int64_t> ids);
  void setRenoiseIds(const DrawSite& site, std::vector<int64_t> ids);
  void setSampled(const DrawSite& site, std::vector<int64_t> ids);

  // InputError naming the site when a draw the generation needs was not recorded, or was recorded
  // with another length than the canvas.
  void initialCanvas(int64_t request, int64_t canvas, std::span<int64_t> ids) override;
  void renoiseIds(const DrawSite& site, std::span<int64_t> ids) override;
  // The device still draws (its result is replaced), under a fixed key.
  std::array<int64_t, 2> sampleKey(const DrawSite& site) override;
  // Every step's samples must be recorded.
  bool replaceSampled(const DrawSite& site, std::span<int64_t> sampled) override;

 private:
  using SiteKey = std::tuple<int64_t, int64_t, int64_t>;
  std::map<SiteKey, std::vector<int64_t>> initial_, renoise_, sampled_;
};

}  // namespace dgemma
