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
  TempDir bcFirst, abFirst;
  const Tokenizer first(writeTokenizer(bcFirst, vocab, "#version: 0.2\r\nb c\r\na b\r\n"));
  const Tokenizer second(writeTokenizer(abFirst, vocab, "#version: 0.2\na b\nb c\n"));
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
  writeBytes(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }), "expected the special token \"</s>\""));
}

TEST(ByteLevelBpe, ByteLevelTokenizerJsonIsRefusedWithTheWayOut) {
  TempDir dir;
  writeBytes(dir / "tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}})");
  EXPECT_TRUE(mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }),
                       dir / "tokenizer.json" + ": pre_tokenizer.type: the pre-tokenizer type \"ByteLevel\" is not "
                                                "supported by dgemma"));
  EXPECT_TRUE(
      mentions(expectInputError([&] { Tokenizer{dir.path.string()}; }), "give dgemma its vocab.json and merges.txt"));
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
