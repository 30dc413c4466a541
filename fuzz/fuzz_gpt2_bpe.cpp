// libFuzzer target: the GPT-2 byte-level BPE tokenizer (runtime/data/text/ByteLevelBpe.h; docs/data.md,
// "Tokenization"). The input is split at the first two 0x1E bytes into a vocab.json, a merges.txt and a
// text; a first part that starts with {"model" is a tokenizer.json instead, whose model is read (the
// merges.txt part is then unused). The files are parsed; when they load, the text is encoded with them
// (after the invalid UTF-8 rule of Utf8Replacement.h) and every id is checked against the vocabulary
// and turned back into bytes. The whole input is also encoded and decoded by the GPT-2 BPE fixture
// (test/fixtures/gpt2_bpe) through dgemma::Tokenizer, special tokens and invalid UTF-8 included.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/FuzzSupport.h"
#include "runtime/data/text/ByteLevelBpe.h"
#include "runtime/data/text/Tokenizer.h"
#include "runtime/data/text/Utf8Replacement.h"
#include "support/Error.h"
#include "support/Json.h"

namespace {

const dgemma::Tokenizer& fixtureTokenizer() {
  static const dgemma::Tokenizer tokenizer(dgemma::fuzz::sourcePath("test/fixtures/gpt2_bpe"));
  return tokenizer;
}

// The parser under test, then the encoder on what it loaded.
void parseAndEncode(std::string_view bytes) {
  const dgemma::Tokenizer& fixture = fixtureTokenizer();
  const std::vector<int32_t> fixtureIds = fixture.encode(bytes);
  dgemma::checkTokenIds(fixtureIds, fixture.vocabSize(), "fuzz text (fixture)");
  (void)fixture.decode(std::vector<int64_t>(fixtureIds.begin(), fixtureIds.end()));

  const size_t vocabEnd = bytes.find('\x1e');
  if (vocabEnd == std::string_view::npos) return;
  size_t mergesEnd = bytes.find('\x1e', vocabEnd + 1);
  if (mergesEnd == std::string_view::npos) mergesEnd = bytes.size();
  // A first part that starts with {"model" is a tokenizer.json's model, the other form of the files.
  const std::string_view vocab = bytes.substr(0, vocabEnd);
  const dgemma::ByteLevelBpe bpe =
      vocab.starts_with("{\"model\"")
          ? dgemma::ByteLevelBpe(dgemma::parseJson(vocab, "tokenizer.json").at("model"), "tokenizer.json")
          : dgemma::ByteLevelBpe(vocab, "vocab.json", bytes.substr(vocabEnd + 1, mergesEnd - vocabEnd - 1),
                                 "merges.txt");
  const std::string text = dgemma::replaceInvalidUtf8(bytes.substr(std::min(mergesEnd + 1, bytes.size())));
  std::vector<int32_t> ids;
  bpe.encode(text, ids);
  dgemma::checkTokenIds(ids, bpe.vocabSize(), "fuzz text");
  std::string decoded;
  for (int32_t id : ids) decoded += bpe.tokenBytes(bpe.idToToken(id));
  // Byte-level BPE loses nothing: the tokens' bytes are the text.
  if (decoded != text) throw std::logic_error("the tokens' bytes differ from the encoded text");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)fixtureTokenizer();  // a failure to load it is a broken build, not a finding: let it throw here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), parseAndEncode);
  return 0;
}
