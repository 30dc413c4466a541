// A progress line for long copies of weights (loading a checkpoint, exporting one): bytes done of
// the total, rate and percentage on stderr, redrawn in place at most 4 times a second. Silent unless
// enabled, which callers do only when stderr is a terminal (transferProgressWanted), so logs and
// pipes never fill with redraws.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace dgemma {

// Whether stderr is a terminal.
bool transferProgressWanted();

class TransferProgress {
 public:
  TransferProgress(std::string label, uint64_t totalBytes, bool enabled, std::ostream* out = nullptr);
  void advance(uint64_t bytes);
  // The final line (when enabled and something was drawn), ending with a newline.
  void finish();

 private:
  void draw();

  std::string label_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
  bool enabled_ = false;
  bool drawn_ = false;
  std::ostream* out_ = nullptr;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point lastDraw_;
};

}  // namespace dgemma
