// libFuzzer target: the bundled tokenizer (data/tokenizer) and the Gemma 4 chat template on arbitrary
// text (docs/data.md, "Chat template", "Tokenization"). The input is split at 0x1E bytes into
// messages whose roles cycle system, user, assistant; each message is also encoded, decoded and
// used as a completion on its own.
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz/FuzzSupport.h"
#include "runtime/data/text/Tokenizer.h"

namespace {

const dgemma::Tokenizer& bundledTokenizer() {
  static const dgemma::Tokenizer tokenizer(dgemma::fuzz::sourcePath("data/tokenizer"));
  return tokenizer;
}

std::vector<dgemma::Message> messagesOf(std::string_view bytes) {
  std::vector<dgemma::Message> messages;
  size_t start = 0;
  while (start <= bytes.size()) {
    size_t end = bytes.find('\x1e', start);
    if (end == std::string_view::npos) end = bytes.size();
    dgemma::Message message;
    message.role = static_cast<dgemma::Message::Role>(messages.size() % 3);
    message.contentIsList = messages.size() % 2 == 1;
    message.content.push_back({dgemma::ContentPart::Text, std::string(bytes.substr(start, end - start)), ""});
    messages.push_back(std::move(message));
    start = end + 1;
  }
  return messages;
}

// The parser under test: what a row's text goes through between the JSONL reader and the batch.
void tokenizeText(std::string_view bytes) {
  const dgemma::Tokenizer& tokenizer = bundledTokenizer();
  const std::vector<dgemma::Message> messages = messagesOf(bytes);
  for (const dgemma::Message& message : messages) {
    const std::string& text = message.content[0].text;
    std::vector<int32_t> ids = tokenizer.encode(text);
    dgemma::checkTokenIds(ids, tokenizer.vocabSize(), "fuzz text");
    std::vector<int64_t> wide(ids.begin(), ids.end());
    (void)tokenizer.decode(wide);
    (void)tokenizer.completionTokens(text);
    (void)dgemma::stripThinking(text);
  }
  dgemma::TokenizedPrompt prompt = dgemma::renderGemma4Prompt(tokenizer, messages, {});
  dgemma::checkTokenIds(prompt.inputIds, tokenizer.vocabSize(), "fuzz prompt");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)bundledTokenizer();  // a failure to load it is a broken build, not a finding: let it throw here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), tokenizeText);
  return 0;
}
