#include "tools/dgemma-run/CanvasView.h"

#include <cstdio>

namespace dgemma::tool {

namespace {

constexpr const char* kClearScreen = "\x1b[H\x1b[2J";
constexpr const char* kBright = "\x1b[1m";
constexpr const char* kDim = "\x1b[2m";
constexpr const char* kReset = "\x1b[0m";

}  // namespace

std::string CanvasView::piece(int64_t id) const {
  std::string text = tokenizer_.decode(std::vector<int64_t>{id});
  for (char& c : text)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return text;
}

void CanvasView::onDenoisePass(const DenoisePassReport& report) {
  out_ << kClearScreen;
  char header[160];
  std::snprintf(header, sizeof header, "canvas %lld  step %lld/%lld  T %.4f\n\n", static_cast<long long>(report.canvas),
                static_cast<long long>(report.step + 1), static_cast<long long>(maxSteps_), report.temperature);
  out_ << header;
  const int64_t L = report.canvasLength;
  for (size_t row = 0; row < report.requests.size(); ++row) {
    const int64_t request = report.requests[row];
    out_ << "[" << request << "] " << committed_[request];
    if (!finished_[request]) {
      for (int64_t position = 0; position < L; ++position) {
        const size_t cell = row * L + position;
        out_ << (report.frozen[row] || report.accepted[cell] ? kBright : kDim) << piece(report.newCanvas[cell]) << kReset;
      }
    }
    out_ << "\n\n";
  }
  out_.flush();
}

void CanvasView::onCanvasCommitted(const CanvasCommitReport& report) {
  const int64_t L = report.canvasLength;
  for (size_t row = 0; row < report.requests.size(); ++row) {
    const int64_t request = report.requests[row];
    if (finished_[request]) continue;
    for (int64_t position = 0; position < L; ++position) {
      const int64_t id = report.tokens[row * L + position];
      if (id != padId_) committed_[request] += piece(id);
    }
    finished_[request] = report.finished[row] != 0;
  }
}

}  // namespace dgemma::tool
