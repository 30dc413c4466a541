#include "runtime/serve/api/StreamText.h"

#include <algorithm>
#include <utility>

namespace dgemma::serve {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

bool isContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

IncrementalText::IncrementalText(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

std::string IncrementalText::push(std::span<const int64_t> ids) {
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  return emitFrom(true);
}

std::string IncrementalText::flush() { return emitFrom(false); }

std::string IncrementalText::emitFrom(bool holdIncomplete) {
  if (pieceEnd_ == ids_.size()) return "";
  const std::span<const int64_t> all(ids_);
  const std::string previous = tokenizer_.decode(all.subspan(pieceStart_, pieceEnd_ - pieceStart_));
  const std::string current = tokenizer_.decode(all.subspan(pieceStart_));
  if (holdIncomplete && current.ends_with(kReplacementCharacter)) return "";
  size_t from = previous.size();
  if (!current.starts_with(previous)) {
    // The new ids rewrote the emitted text (a byte run that stopped being valid UTF-8). What was emitted
    // cannot be taken back; go on from the first character boundary past it.
    from = std::min(from, current.size());
    while (from < current.size() && isContinuationByte(current[from])) ++from;
  }
  if (from >= current.size()) return "";
  pieceStart_ = pieceEnd_;
  pieceEnd_ = ids_.size();
  return current.substr(from);
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& stop) { return stop.empty(); });
}

std::string StopMatcher::push(std::string_view delta) {
  if (stopped_) return "";
  pending_.append(delta);
  size_t match = std::string::npos;
  for (const std::string& stop : stops_) match = std::min(match, pending_.find(stop));
  if (match != std::string::npos) {
    stopped_ = true;
    std::string text = pending_.substr(0, match);
    pending_.clear();
    return text;
  }
  // Hold back the longest tail of the text that is a proper prefix of a stop string.
  size_t held = 0;
  for (const std::string& stop : stops_) {
    for (size_t length = std::min(stop.size() - 1, pending_.size()); length > held; --length) {
      if (std::string_view(pending_).substr(pending_.size() - length) == std::string_view(stop).substr(0, length)) {
        held = length;
        break;
      }
    }
  }
  std::string text = pending_.substr(0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return text;
}

std::string StopMatcher::flush() {
  if (stopped_) return "";
  return std::exchange(pending_, std::string());
}

}  // namespace dgemma::serve
