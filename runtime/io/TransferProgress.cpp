#include "runtime/io/TransferProgress.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace dgemma {

namespace {

constexpr std::chrono::milliseconds kRedrawInterval(250);

std::string gigabytes(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return text;
}

}  // namespace

bool transferProgressWanted() { return ::isatty(STDERR_FILENO) != 0; }

TransferProgress::TransferProgress(std::string label, uint64_t totalBytes, bool enabled, std::ostream* out)
    : label_(std::move(label)),
      total_(totalBytes),
      enabled_(enabled),
      out_(out ? out : &std::cerr),
      start_(std::chrono::steady_clock::now()),
      lastDraw_(start_) {}

void TransferProgress::advance(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - lastDraw_ < kRedrawInterval) return;
  lastDraw_ = now;
  draw();
}

void TransferProgress::draw() {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double percent = total_ ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
  char rate[48];
  std::snprintf(rate, sizeof rate, "%.0f%%, %.2f GB/s", percent, seconds > 0 ? static_cast<double>(done_) / 1e9 / seconds : 0.0);
  *out_ << "\r" << label_ << ": " << gigabytes(done_) << " of " << gigabytes(total_) << " (" << rate << ")\x1b[K"
        << std::flush;
  drawn_ = true;
}

void TransferProgress::finish() {
  if (!enabled_) return;
  draw();
  *out_ << "\n" << std::flush;
}

}  // namespace dgemma
