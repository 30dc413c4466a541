// The text of a streamed choice (docs/serving.md, "Streaming"): token ids become text deltas as they
// are committed, and stop strings end the choice.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/data/text/Tokenizer.h"

namespace dgemma::serve {

// Incremental detokenization: feed every committed token id of a choice; push returns the text newly
// safe to emit, so that the concatenation of everything returned (flush included) is decode(all ids).
// A trailing U+FFFD is held back: it is what an incomplete byte-fallback sequence decodes to, and the
// next ids may complete the character.
//
// Decoding all ids on every push would cost quadratic time in the length of the completion; as in
// vLLM and HF's TextStreamer, only the ids from the start of the previously emitted piece are
// decoded, and the new text is what that decoding adds to the previous piece's text. Decoding the
// previous piece too keeps decoder effects that depend on the first id (a stripped leading space)
// out of the difference.
class IncrementalText {
 public:
  explicit IncrementalText(const Tokenizer& tokenizer);
  std::string push(std::span<const int64_t> ids);
  // Whatever is held back (a U+FFFD that never completed), after the last push.
  std::string flush();

 private:
  std::string emitFrom(bool holdIncomplete);

  const Tokenizer& tokenizer_;
  std::vector<int64_t> ids_;
  size_t pieceStart_ = 0;  // first id of the last emitted piece
  size_t pieceEnd_ = 0;    // one past its last id: ids from here on are not emitted yet
};

// Stop strings: feed text deltas; push emits what cannot be the start of a stop string. On a match
// stopped() is true and the emitted text ends right before the stop string (OpenAI leaves it out);
// later pushes emit nothing. With several stop strings the earliest match in the text wins.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(std::string_view delta);
  // The held-back text at the end of the choice (a partial stop string is ordinary text then).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // text held back: it may begin a stop string
  bool stopped_ = false;
};

}  // namespace dgemma::serve
