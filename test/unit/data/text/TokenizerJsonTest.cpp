// The tokenizer.json backend of dgemma_data_text against HF `tokenizers`: test/fixtures/tokenizer_json/
// was made by tools/reference/make_tokenizer_json_fixtures.py (the bundled SentencePiece tokenizer
// converted by transformers, and a tiny byte-fallback BPE tokenizer with variants).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/Error.h"
#include "runtime/data/text/Tokenizer.h"
#include "test/unit/TestSupport.h"
#include "runtime/data/text/TokenizerJson.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expectInputError;
using test::TempDir;

void writeTokenizerJson(const TempDir& dir, const json& tokenizerJson) {
  std::ofstream(dir.path / "tokenizer.json") << tokenizerJson.dump();
}

json readJson(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

const fs::path kDir = DGEMMA_TOKENIZER_JSON_DIR;

json byteFallbackJson() { return readJson(kDir / "byte_fallback" / "tokenizer.json"); }

// Writes `tokenizerJson` into a fresh directory and returns the InputError message of loading it.
std::string loadError(const json& tokenizerJson) {
  TempDir dir;
  writeTokenizerJson(dir, tokenizerJson);
  return expectInputError([&] { Tokenizer tok(dir.path.string()); });
}

TEST(TokenizerJson, ConvertedTokenizerMatchesFastTokenizer) {
  const json fixture = readJson(kDir / "encode.json");
  const Tokenizer tok(kDir.string());
  ASSERT_EQ(tok.backend(), "tokenizers");
  EXPECT_EQ(tok.vocabSize(), fixture.at("vocab_size").get<int64_t>());
  const json& texts = fixture.at("texts");
  ASSERT_GE(texts.size(), 80u);
  for (const json& t : texts) {
    const std::string text = t.at("text");
    SCOPED_TRACE(t.at("kind").get<std::string>() + " " + t.at("name").get<std::string>() + " " + json(text).dump());
    const auto ids = t.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), ids);
    if (t.at("kind") == "completion") {
      std::vector<int32_t> withEos = ids;
      if (withEos.empty() || withEos.back() != tok.eosId()) withEos.push_back(tok.eosId());
      EXPECT_EQ(tok.completionTokens(text), withEos);
    }
  }
}

TEST(TokenizerJson, ByteFallbackVariantsMatchTokenizers) {
  const json fixture = readJson(kDir / "variants.json");
  const json base = byteFallbackJson();
  ASSERT_GE(fixture.at("variants").size(), 10u);
  bool sawBytePieces = false;
  for (const json& variant : fixture.at("variants")) {
    const std::string name = variant.at("name");
    SCOPED_TRACE(name);
    json tj = base;
    for (const auto& [key, value] : variant.at("patch").items()) {
      if (key == "model") tj["model"].update(value);
      else tj[key] = value;
    }
    TempDir dir;
    writeTokenizerJson(dir, tj);
    fs::copy_file(kDir / "byte_fallback" / "tokenizer_config.json", dir.path / "tokenizer_config.json");
    const Tokenizer tok(dir.path.string());
    EXPECT_EQ(tok.eosId(), 1);
    EXPECT_EQ(tok.bosId(), 2);
    EXPECT_EQ(tok.padId(), 0);
    for (const json& t : variant.at("texts")) {
      const std::string text = t.at("text");
      SCOPED_TRACE(json(text).dump());
      const auto expected = t.at("ids").get<std::vector<int32_t>>();
      EXPECT_EQ(tok.encode(text), expected);
      if (name == "byte_fallback")
        sawBytePieces |= std::any_of(expected.begin(), expected.end(), [](int32_t id) { return id >= 4 && id < 260; });
    }
  }
  EXPECT_TRUE(sawBytePieces) << "the byte_fallback variant never produced a <0xXX> piece";
}

TEST(TokenizerJson, ByteFallbackPieces) {
  TempDir dir;
  writeTokenizerJson(dir, byteFallbackJson());
  const Tokenizer tok(dir.path.string());
  // U+2603 (not in the vocabulary): its three UTF-8 bytes E2 98 83, after the prepended "▁".
  const std::vector<int32_t> ids = tok.encode("☃");
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), (std::vector<int32_t>{4 + 0xE2, 4 + 0x98, 4 + 0x83}));
}

TEST(TokenizerJson, ModelIsPreferredOverTokenizerJson) {
  TempDir dir;
  fs::copy_file(fs::path(DGEMMA_TOKENIZER_DIR) / "tokenizer.model", dir.path / "tokenizer.model");
  std::ofstream(dir.path / "tokenizer.json") << "not json";
  const Tokenizer tok(dir.path.string());
  EXPECT_EQ(tok.backend(), "sentencepiece");
}

TEST(TokenizerJson, UnsupportedNormalizer) {
  json tj = byteFallbackJson();
  tj["normalizer"]["normalizers"][1] = {{"type", "NFKC"}};
  const std::string message = loadError(tj);
  EXPECT_NE(message.find("tokenizer.json: normalizer.normalizers[1].type: the normalizer type \"NFKC\" is not supported"),
            std::string::npos)
      << message;
  tj["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "▁"}};
  EXPECT_NE(loadError(tj).find("normalizer.pattern: regex patterns are not supported"), std::string::npos);
}

TEST(TokenizerJson, UnsupportedPreTokenizer) {
  json tj = byteFallbackJson();
  // (A ByteLevel pre-tokenizer goes to the gpt2-bpe backend: ByteLevelBpeTest.cpp.)
  tj["pre_tokenizer"] = {{"type", "Whitespace"}};
  std::string message = loadError(tj);
  EXPECT_NE(message.find("tokenizer.json: pre_tokenizer.type: the pre-tokenizer type \"Whitespace\" is not supported"),
            std::string::npos)
      << message;
  tj["pre_tokenizer"] = {{"type", "Sequence"},
                         {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"String", "x"}}},
                                             {"behavior", "Sideways"}, {"invert", false}}}}};
  message = loadError(tj);
  EXPECT_NE(message.find("pre_tokenizer.pretokenizers[0].behavior: expected Removed"), std::string::npos) << message;
  tj["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Isolated";
  tj["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
  EXPECT_NE(loadError(tj).find("pre_tokenizer.pretokenizers[0].invert"), std::string::npos);
}

TEST(TokenizerJson, MalformedMerges) {
  json tj = byteFallbackJson();
  tj["model"]["merges"][12] = 7;
  std::string message = loadError(tj);
  EXPECT_NE(message.find("tokenizer.json: model.merges[12]: expected [\"LEFT\", \"RIGHT\"] or \"LEFT RIGHT\", got number 7"),
            std::string::npos)
      << message;
  tj["model"]["merges"][12] = json::array({"a", "b", "c"});
  EXPECT_NE(loadError(tj).find("model.merges[12]: expected"), std::string::npos);
  tj["model"]["merges"][12] = "no_space";
  EXPECT_NE(loadError(tj).find("model.merges[12]: expected \"LEFT RIGHT\""), std::string::npos);
  tj["model"]["merges"][12] = json::array({"☃", "a"});
  message = loadError(tj);
  EXPECT_NE(message.find("model.merges[12]: the piece \"☃\" is not in model.vocab"), std::string::npos) << message;
  tj["model"]["merges"] = "none";
  EXPECT_NE(loadError(tj).find("model.merges: expected an array, got string"), std::string::npos);
}

TEST(TokenizerJson, MissingOrUnsupportedModel) {
  json tj = byteFallbackJson();
  tj.erase("model");
  std::string message = loadError(tj);
  EXPECT_NE(message.find("tokenizer.json: (root).model: expected a value, but the key is missing"), std::string::npos)
      << message;
  tj = byteFallbackJson();
  tj["model"]["type"] = "Unigram";
  EXPECT_NE(loadError(tj).find("model.type: the model type \"Unigram\" is not supported"), std::string::npos);
  tj = byteFallbackJson();
  tj["model"].erase("vocab");
  EXPECT_NE(loadError(tj).find("model.vocab: expected a value"), std::string::npos);
  tj = byteFallbackJson();
  tj["model"]["vocab"]["<pad>"] = "zero";
  EXPECT_NE(loadError(tj).find("model.vocab[\"<pad>\"]: expected a non-negative integer id"), std::string::npos);
  tj = byteFallbackJson();
  tj["model"]["unk_token"] = "<nope>";
  EXPECT_NE(loadError(tj).find("model.unk_token: the unknown token \"<nope>\" is not in model.vocab"),
            std::string::npos);
  tj = byteFallbackJson();
  tj["model"]["dropout"] = 0.1;
  EXPECT_NE(loadError(tj).find("model.dropout"), std::string::npos);
  tj = byteFallbackJson();
  tj["model"]["continuing_subword_prefix"] = "##";
  EXPECT_NE(loadError(tj).find("model.continuing_subword_prefix"), std::string::npos);
  tj = byteFallbackJson();
  tj["added_tokens"][2]["id"] = -4;
  EXPECT_NE(loadError(tj).find("added_tokens[2].id: expected a non-negative integer id"), std::string::npos);
  EXPECT_NE(loadError(json::array()).find("(root): expected an object"), std::string::npos);
}

TEST(TokenizerJson, NoEosIsAnError) {
  json tj = byteFallbackJson();
  tj["added_tokens"].erase(1);
  tj["model"]["vocab"].erase("<eos>");
  const std::string message = loadError(tj);
  EXPECT_NE(message.find("the tokenizer defines no EOS id"), std::string::npos) << message;
}

TEST(TokenizerJson, NotJsonIsAnError) {
  TempDir dir;
  std::ofstream(dir.path / "tokenizer.json") << "{ nope";
  const std::string message = expectInputError([&] { Tokenizer tok(dir.path.string()); });
  EXPECT_NE(message.find((dir.path / "tokenizer.json").string() + ": invalid JSON at byte "), std::string::npos) << message;
  // Nesting is bounded while the file is read (support/Json.h).
  std::ofstream(dir.path / "tokenizer.json", std::ios::trunc) << std::string(100000, '[') << std::string(100000, ']');
  const std::string deep = expectInputError([&] { Tokenizer tok(dir.path.string()); });
  EXPECT_NE(deep.find((dir.path / "tokenizer.json").string() + ": JSON nested deeper than 64 levels"), std::string::npos) << deep;
}

TEST(TokenizerJson, SpecialTokensOfTheJsonBackend) {
  const Tokenizer tok(kDir.string());
  EXPECT_EQ(tok.specialTokenId("<|turn>"), 7);
  EXPECT_FALSE(tok.findSpecialTokenId("\n").has_value());  // an ordinary vocabulary entry here
  const std::string message = expectInputError([&] { tok.specialTokenId("<nope>"); });
  EXPECT_NE(message.find((kDir / "tokenizer.json").string() + ": the tokenizer has no special token \"<nope>\""),
            std::string::npos)
      << message;
  EXPECT_NE(expectInputError([&] { tok.checkVocabSize(200); }).find("tokenizer.json: the tokenizer has 256 pieces"),
            std::string::npos);
}

}  // namespace
}  // namespace dgemma
