// The gpt2-bpe backend of dgemma::Tokenizer (vocab.json + merges.txt; runtime/data/text/ByteLevelBpe.h)
// and the invalid-UTF-8 rule of every backend (Utf8Replacement.h). Its ids are held to HF's
// GPT2Tokenizer on 12,000 generated records by test/interop/tokenizer_parity_interop.py; these tests pin
// the files it accepts, the errors for those it refuses, and the Tokenizer contract around it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/data/text/Utf8Replacement.h"
#include "support/Error.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expectInputError;
using test::mentions;
using test::TempDir;
using test::writeBytes;

const std::string kFixture = DGEMMA_GPT2_BPE_DIR;
constexpr int32_t kEndOfText = 4095;  // "<|endoftext|>", the fixture's last id as in GPT-2

const Tokenizer& fixture() {
  static const Tokenizer tokenizer(kFixture);
  return tokenizer;
}

// The fixture's 256 byte characters (ids 0-255, the trainer's initial alphabet) and "<|endoftext|>".
json byteVocab() {
  const json full = json::parse(test::fileBytes(kFixture + "/vocab.json"));
  json vocab = json::object();
  for (const auto& [token, id] : full.items())
    if (id.get<int>() < 256) vocab[token] = id;
  EXPECT_EQ(vocab.size(), 256u);
  vocab["<|endoftext|>"] = 300;
  return vocab;
}

// A tokenizer directory of vocab.json and merges.txt.
std::string writeTokenizer(const TempDir& dir, const json& vocab, const std::string& merges) {
  writeBytes(dir / "vocab.json", vocab.dump());
  writeBytes(dir / "merges.txt", merges);
  return dir.path.string();
}

TEST(ByteLevelBpe, FixtureLoadsAsGpt2) {
  const Tokenizer& tok = fixture();
  EXPECT_EQ(tok.backend(), "gpt2-bpe");
  EXPECT_EQ(tok.file(), kFixture + "/vocab.json");
  EXPECT_EQ(tok.vocabSize(), 4096);
  EXPECT_EQ(tok.eosId(), kEndOfText);
  EXPECT_EQ(tok.bosId(), kEndOfText);
  EXPECT_EQ(tok.padId(), -1);
  EXPECT_TRUE(tok.isSpecial(kEndOfText));
  EXPECT_FALSE(tok.isSpecial(0));
  EXPECT_EQ(tok.specialTokenId("<|endoftext|>"), kEndOfText);
}

TEST(ByteLevelBpe, EndOfTextIsOneIdAnywhereInText) {
  const Tokenizer& tok = fixture();
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<int32_t>{kEndOfText});
  const std::vector<int32_t> ids = tok.encode("a<|endoftext|><|endoftext|> b");
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[1], kEndOfText);
  EXPECT_EQ(ids[2], kEndOfText);
  EXPECT_EQ(tok.completionTokens("x").back(), kEndOfText);
}

TEST(ByteLevelBpe, DecodeIsTheTokensBytesAndRoundTrips) {
  const Tokenizer& tok = fixture();
  const std::string text = "Hello,  wörld\t日本語 👩🏻‍💻 it's\n\n <|endoftext|>x";
  const std::vector<int32_t> ids = tok.encode(text);
  const std::vector<int64_t> wide(ids.begin(), ids.end());
  EXPECT_EQ(tok.decode(wide), text);
  const std::vector<std::string> bytes = tok.tokenBytes();
  std::string joined;
  for (int32_t id : ids) joined += bytes[id];
  EXPECT_EQ(joined, text);
  EXPECT_EQ(bytes[kEndOfText], "<|endoftext|>");
  // Bytes that end inside a character decode to U+FFFD, as HF's lossy decoding does; the whole
  // character decodes to itself.
  auto byteId = [&](char byte) -> int64_t {
    return std::find(bytes.begin(), bytes.end(), std::string(1, byte)) - bytes.begin();
  };
  EXPECT_EQ(tok.decode(std::vector<int64_t>{byteId('\xE2'), byteId('\x82')}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::vector<int64_t>{byteId('\xE2'), byteId('\x82'), byteId('\xAC')}), "\xE2\x82\xAC");
  EXPECT_EQ(tok.decode(std::vector<int64_t>{-1, 1 << 20}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8Replacement, MaximalSubpartsAsCPython) {
  // Expected values: Python 3.11's bytes.decode("utf-8", errors="replace").
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replaceInvalidUtf8("plain ascii"), "plain ascii");
  EXPECT_EQ(replaceInvalidUtf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(replaceInvalidUtf8("\xF0\x9F\x98"), r);                // truncated: one subpart
  EXPECT_EQ(replaceInvalidUtf8("\xE2\x82("), r + "(");             // broken by an ASCII byte
  EXPECT_EQ(replaceInvalidUtf8("\xED\xA0\x80"), r + r + r);        // a surrogate: no valid prefix
  EXPECT_EQ(replaceInvalidUtf8("\xC0\xAF"), r + r);                // overlong
  EXPECT_EQ(replaceInvalidUtf8("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(replaceInvalidUtf8("a\xE1\x80\xE1"
                               "b"),
            "a" + r + r + "b");
  EXPECT_EQ(replaceInvalidUtf8("\x80\xFF"), r + r);
}

TEST(ByteLevelBpe, InvalidUtf8IsEncodedAsItsReplacement) {
  const Tokenizer& tok = fixture();
  EXPECT_EQ(tok.encode("a\xFF\xC3 b\xF0\x9F\x98"), tok.encode("a\xEF\xBF\xBD\xEF\xBF\xBD b\xEF\xBF\xBD"));
}

TEST(ByteLevelBpe, MergesApplyByRankAndSkipVersionLines) {
  json vocab = byteVocab();
  vocab["ab"] = 256;
  vocab["bc"] = 257;
  TempDir dir;  // one per test: each tokenizer is loaded before the files are rewritten
  const Tokenizer first(writeTokenizer(dir, vocab, "#version: 0.2\r\nb c\r\na b\r\n"));
  const Tokenizer second(writeTokenizer(dir, vocab, "#version: 0.2\na b\nb c\n"));
  EXPECT_EQ(first.encode("abc"), (std::vector<int32_t>{vocab["a"].get<int32_t>(), 257}));
  EXPECT_EQ(second.encode("abc"), (std::vector<int32_t>{256, vocab["c"].get<int32_t>()}));
  EXPECT_EQ(first.vocabSize(), 301);  // 1 + the largest id, "<|endoftext|>"
}

TEST(ByteLevelBpe, BadVocabularyIsLocated) {
  TempDir dir;
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, json::array(), "")); }),
                       dir / "vocab.json" + ": expected a JSON object of token -> id"));
  json vocab = byteVocab();
  vocab["word"] = "7";
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "")); }),
                       "the token \"word\": expected an integer id from 0 to 16777215, got \"7\""));
  vocab["word"] = -1;
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "")); }), "got -1"));
  vocab["word"] = 300;
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "")); }),
                       "both have the id 300; expected one token per id"));
  vocab = byteVocab();
  vocab.erase("\xC4\x80");  // "Ā", byte 0x00's character
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "")); }),
                       "expected a token for every byte's character (GPT-2's byte-level alphabet), but \"\\xc4\\x80\" "
                       "(byte 0x00) is missing"));
  writeBytes(dir / "vocab.json", "{\"a\": 1,");
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }), dir / "vocab.json" + ": invalid JSON"));
}

TEST(ByteLevelBpe, BadMergesAreLocatedByLine) {
  TempDir dir;
  json vocab = byteVocab();
  vocab["ab"] = 256;
  const std::string merges = dir / "merges.txt";
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "#version: 0.2\na b\nab\n")); }),
                       merges + ":3: expected a merge \"LEFT RIGHT\" (two tokens separated by one space), got \"ab\""));
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "a b c\n")); }), merges + ":1: "));
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "\n")); }), merges + ":1: "));
  EXPECT_TRUE(
      mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, vocab, "a xyz\n")); }),
               merges + ":1: expected the merge's tokens in " + dir / "vocab.json" + ", but \"xyz\" is not there"));
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer(writeTokenizer(dir, byteVocab(), "a b\n")); }),
                       merges + ":1: expected the merged token \"ab\" in"));
}

TEST(ByteLevelBpe, DirectoryAndConfigErrors) {
  TempDir dir;
  writeBytes(dir / "vocab.json", byteVocab().dump());
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }),
                       dir / "merges.txt" + ": expected this file beside " + dir / "vocab.json"));
  writeBytes(dir / "merges.txt", "");
  writeBytes(dir / "tokenizer_config.json", R"({"add_prefix_space": true})");
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }),
                       dir / "tokenizer_config.json" + ": add_prefix_space: true is not supported"));
  writeBytes(dir / "tokenizer_config.json",
             R"({"added_tokens_decoder": {"301": {"content": "<pad>", "lstrip": true, "special": true}}})");
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }),
                       "added_tokens_decoder[\"301\"].lstrip: true is not supported"));
  writeBytes(dir / "tokenizer_config.json", R"({"added_tokens_decoder": {"99999999": {"content": "<big>"}}})");
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }),
                       "added_tokens_decoder[\"99999999\"]: expected an id from 0 to 16777215, got 99999999"));
  writeBytes(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }), "expected the special token \"</s>\""));
}

TEST(ByteLevelBpe, TokenizerJsonOfTransformersIsTheSameTokenizer) {
  // test/fixtures/gpt2_bpe_json: the fixture saved by transformers as tokenizer.json.
  const Tokenizer json(DGEMMA_GPT2_BPE_JSON_DIR);
  EXPECT_EQ(json.backend(), "gpt2-bpe");
  EXPECT_EQ(json.file(), std::string(DGEMMA_GPT2_BPE_JSON_DIR) + "/tokenizer.json");
  EXPECT_EQ(json.vocabSize(), fixture().vocabSize());
  EXPECT_EQ(json.eosId(), kEndOfText);
  EXPECT_EQ(json.tokenBytes(), fixture().tokenBytes());
  const std::string text = "The <|endoftext|> 日本語, it's\t\t 42 \xFF\xC3 \xF0\x9F\x98\x80";
  EXPECT_EQ(json.encode(text), fixture().encode(text));
}

json byteLevelTokenizerJson(const json& vocab, const json& merges) {
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

TEST(ByteLevelBpe, BadByteLevelTokenizerJsonIsLocated) {
  TempDir dir;
  const std::string file = dir / "tokenizer.json";
  auto errorOf = [&](const json& tokenizerJson) {
    writeBytes(file, tokenizerJson.dump());
    return expectInputError([&] { Tokenizer{dir.path.string()}; });
  };
  json vocab = byteVocab();
  vocab["ab"] = 256;
  EXPECT_TRUE(mentions(errorOf(byteLevelTokenizerJson({{"a", 0}}, json::array())),
                       file + ": model.vocab: expected a token for every byte's character"));
  EXPECT_TRUE(mentions(
      errorOf(byteLevelTokenizerJson(vocab, json::array({json::array({"a", "b"}), json::array({"a", "xyz"})}))),
      file + ": model.merges[1]: expected the merge's tokens in"));
  EXPECT_TRUE(mentions(errorOf(byteLevelTokenizerJson(vocab, json::array({"a b", "a b c"}))),
                       file + ": model.merges[1]: expected [\"LEFT\", \"RIGHT\"] or \"LEFT RIGHT\""));
  json prefixed = byteLevelTokenizerJson(vocab, json::array());
  prefixed["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_TRUE(mentions(errorOf(prefixed), file + ": pre_tokenizer.add_prefix_space: true is not supported"));
  json normalized = byteLevelTokenizerJson(vocab, json::array());
  normalized["normalizer"] = {{"type", "NFC"}};
  EXPECT_TRUE(mentions(errorOf(normalized), file + ": normalizer: expected null"));
  json dropout = byteLevelTokenizerJson(vocab, json::array());
  dropout["model"]["dropout"] = 0.1;
  EXPECT_TRUE(mentions(errorOf(dropout), file + ": model.dropout: BPE dropout is not supported"));
  json stripped = byteLevelTokenizerJson(vocab, json::array());
  stripped["added_tokens"] = {{{"id", 301}, {"content", "<x>"}, {"rstrip", true}}};
  EXPECT_TRUE(mentions(errorOf(stripped), file + ": added_tokens[0].rstrip: true is not supported"));
  // A ByteLevel step inside a Sequence (other patterns before it, as Llama 3's) is not GPT-2's.
  json sequence = byteLevelTokenizerJson(vocab, json::array());
  sequence["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "ByteLevel"}}}}};
  EXPECT_TRUE(mentions(errorOf(sequence),
                       file + ": pre_tokenizer.pretokenizers[0].type: the pre-tokenizer type \"ByteLevel\" is not "
                              "supported"));
}

TEST(ByteLevelBpe, IgnoreMergesTakesAWholePieceThatIsAToken) {
  json vocab = byteVocab();
  vocab["ab"] = 256;
  vocab["bc"] = 257;
  vocab["abc"] = 258;
  json tokenizerJson = byteLevelTokenizerJson(vocab, json::array({"b c"}));
  TempDir dir;  // one per test: each tokenizer is loaded before the file is rewritten
  writeBytes(dir / "tokenizer.json", tokenizerJson.dump());
  const Tokenizer merged(dir.path.string());
  tokenizerJson["model"]["ignore_merges"] = true;
  writeBytes(dir / "tokenizer.json", tokenizerJson.dump());
  const Tokenizer whole(dir.path.string());
  EXPECT_EQ(merged.encode("abc"), (std::vector<int32_t>{vocab["a"].get<int32_t>(), 257}));
  EXPECT_EQ(whole.encode("abc"), std::vector<int32_t>{258});
}

TEST(ByteLevelBpe, AddedTokensOfTheConfigAreSingleIds) {
  TempDir dir;
  writeTokenizer(dir, byteVocab(), "");
  writeBytes(dir / "tokenizer_config.json",
             R"({"pad_token": "<pad>", "added_tokens_decoder": {"301": {"content": "<pad>", "special": true},
                 "302": {"content": "<pad2>", "special": false}}})");
  const Tokenizer tok(dir.path.string());
  EXPECT_EQ(tok.padId(), 301);
  EXPECT_EQ(tok.vocabSize(), 303);
  const std::vector<int32_t> ids = tok.encode("<pad2><pad>");
  EXPECT_EQ(ids, (std::vector<int32_t>{302, 301}));
  EXPECT_TRUE(tok.isSpecial(301));
  EXPECT_FALSE(tok.isSpecial(302));
  EXPECT_EQ(tok.decode(std::vector<int64_t>{302, 301, 300}), "<pad2><pad><|endoftext|>");
}

}  // namespace
}  // namespace dgemma
