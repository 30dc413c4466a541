// The visual terminal mode of `dgemma-run generate --visual` (docs/generation.md): after every
// denoising pass the screen shows each request of the micro-batch with its committed text and the
// canvas being denoised, accepted positions bright and renoised ones dim.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/generate/GenerationObserver.h"

namespace dgemma::tool {

class CanvasView : public GenerationObserver {
 public:
  CanvasView(const Tokenizer& tokenizer, std::ostream& out, int64_t maxDenoisingSteps, int64_t padId)
      : tokenizer_(tokenizer), out_(out), maxSteps_(maxDenoisingSteps), padId_(padId) {}

  void onDenoisePass(const DenoisePassReport& report) override;
  void onCanvasCommitted(const CanvasCommitReport& report) override;

 private:
  // One piece per token, control characters shown as spaces so the layout holds.
  std::string piece(int64_t id) const;

  const Tokenizer& tokenizer_;
  std::ostream& out_;
  int64_t maxSteps_;
  int64_t padId_;
  std::map<int64_t, std::string> committed_;  // request id -> its committed text so far
  std::map<int64_t, bool> finished_;
};

}  // namespace dgemma::tool
