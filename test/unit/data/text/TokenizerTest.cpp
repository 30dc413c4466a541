// dgemma_data_text against HF: test/fixtures/tokenizer/*.json were made by
// tools/reference/make_tokenizer_fixtures.py with transformers' GemmaTokenizer loaded from
// data/tokenizer and a reimplementation of the Gemma 4 chat template (docs/data.md, "Chat template").
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/Error.h"
#include "runtime/data/text/Tokenizer.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expectInputError;
using test::TempDir;

const Tokenizer& bundled() {
  static const Tokenizer tokenizer(DGEMMA_TOKENIZER_DIR);
  return tokenizer;
}

// The bundled SentencePiece tokenizer or its tokenizer.json conversion (test/fixtures/tokenizer_json,
// tools/reference/make_tokenizer_json_fixtures.py: the converted fast tokenizer gives the same ids as
// the SentencePiece one on every fixture, so both backends must pass the same tests).
const Tokenizer& loaded(const std::string& directory) {
  if (directory == DGEMMA_TOKENIZER_DIR) return bundled();
  static const Tokenizer tokenizer(DGEMMA_TOKENIZER_JSON_DIR);
  return tokenizer;
}

class Backends : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Tokenizer, Backends, ::testing::Values(DGEMMA_TOKENIZER_DIR, DGEMMA_TOKENIZER_JSON_DIR),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == DGEMMA_TOKENIZER_DIR ? std::string("SentencePiece")
                                                                     : std::string("TokenizerJson");
                         });

TEST_P(Backends, BackendIsChosenByFile) {
  const Tokenizer& tok = loaded(GetParam());
  const bool sp = GetParam() == DGEMMA_TOKENIZER_DIR;
  EXPECT_EQ(tok.backend(), sp ? "sentencepiece" : "tokenizers");
  EXPECT_EQ(tok.file(), GetParam() + (sp ? "/tokenizer.model" : "/tokenizer.json"));
}

json readFixture(const std::string& name) {
  std::ifstream in(std::string(DGEMMA_TOKENIZER_FIXTURES) + "/" + name);
  EXPECT_TRUE(in.good()) << name;
  return json::parse(in);
}

std::vector<Message> toMessages(const json& messages) {
  std::vector<Message> out;
  for (const json& m : messages) {
    Message message;
    const std::string role = m.at("role");
    message.role = role == "system" ? Message::System : role == "assistant" ? Message::Assistant : Message::User;
    if (m.at("content").is_string()) {
      message.content.push_back({ContentPart::Text, m.at("content").get<std::string>(), ""});
    } else {
      message.contentIsList = true;
      for (const json& p : m.at("content")) {
        if (p.at("type") == "image")
          message.content.push_back({ContentPart::Image, "", p.at("image").get<std::string>()});
        else message.content.push_back({ContentPart::Text, p.at("text").get<std::string>(), ""});
      }
    }
    out.push_back(std::move(message));
  }
  return out;
}

TEST_P(Backends, ConversationsMatchHf) {
  const json fixture = readFixture("conversations.json");
  const Tokenizer& tok = loaded(GetParam());
  ASSERT_EQ(fixture.at("vocab_size").get<int64_t>(), tok.vocabSize());
  const json& conversations = fixture.at("conversations");
  ASSERT_GE(conversations.size(), 20u);
  for (const json& c : conversations) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const std::vector<Message> messages = toMessages(c.at("messages"));
    const auto counts = c.at("image_soft_tokens").get<std::vector<int64_t>>();
    EXPECT_EQ(renderGemma4PromptText(tok, messages, counts), c.at("prompt_text").get<std::string>());
    const TokenizedPrompt prompt = renderGemma4Prompt(tok, messages, counts);
    EXPECT_EQ(prompt.inputIds, c.at("input_ids").get<std::vector<int32_t>>());
    EXPECT_EQ(prompt.mmTokenTypeIds, c.at("mm_token_type_ids").get<std::vector<int32_t>>());
    const std::vector<int32_t> completion = tok.completionTokens(c.at("completion").get<std::string>());
    EXPECT_EQ(completion, c.at("completion_ids").get<std::vector<int32_t>>());
    EXPECT_NO_THROW(checkTokenIds(prompt.inputIds, tok.vocabSize(), "prompt"));
    EXPECT_NO_THROW(checkTokenIds(completion, tok.vocabSize(), "completion"));
  }
}

TEST_P(Backends, EncodeMatchesHf) {
  const json fixture = readFixture("encode.json");
  for (const json& t : fixture.at("texts")) {
    const std::string text = t.at("text");
    SCOPED_TRACE(json(text).dump());
    EXPECT_EQ(loaded(GetParam()).encode(text), t.at("ids").get<std::vector<int32_t>>());
  }
}

TEST_P(Backends, SpecialTokenIds) {
  const Tokenizer& tok = loaded(GetParam());
  const json fixture = readFixture("conversations.json");
  for (const auto& [name, id] : fixture.at("special_tokens").items()) EXPECT_EQ(tok.specialTokenId(name), id) << name;
  const std::vector<std::string> table = {"<pad>", "<eos>",   "<bos>",   "<unk>",      "<image>",    "<boi>",
                                          "<eoi>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"};
  for (size_t i = 0; i < table.size(); ++i) EXPECT_EQ(tok.specialTokenId(table[i]), static_cast<int32_t>(i));
  EXPECT_EQ(tok.padId(), 0);
  EXPECT_EQ(tok.eosId(), 1);
  EXPECT_EQ(tok.bosId(), 2);
  EXPECT_EQ(tok.imageTokenId(), 4);
  EXPECT_EQ(tok.boiTokenId(), 5);
  EXPECT_EQ(tok.eoiTokenId(), 6);
  EXPECT_EQ(tok.vocabSize(), 256);
  EXPECT_FALSE(tok.findSpecialTokenId("<mask>").has_value());
  EXPECT_FALSE(tok.findSpecialTokenId("the").has_value());
  EXPECT_NE(expectInputError([&] { tok.specialTokenId("<nope>"); }).find("<nope>"), std::string::npos);
}

TEST(Tokenizer, VocabSizeCheck) {
  EXPECT_NO_THROW(bundled().checkVocabSize(256));
  EXPECT_NO_THROW(bundled().checkVocabSize(262144));
  const std::string message = expectInputError([] { bundled().checkVocabSize(255); });
  EXPECT_NE(message.find("256 pieces"), std::string::npos) << message;
  EXPECT_NE(message.find("vocab_size is 255"), std::string::npos) << message;
}

TEST_P(Backends, SpecialsAreNeverSplit) {
  const Tokenizer& tok = loaded(GetParam());
  const std::vector<std::string> specials = {"<pad>", "<eos>",   "<bos>",   "<unk>",      "<image>",    "<boi>",
                                             "<eoi>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"};
  for (const std::string& s : specials) {
    SCOPED_TRACE(s);
    const int32_t id = tok.specialTokenId(s);
    EXPECT_EQ(tok.encode(s), std::vector<int32_t>{id});
    for (const std::string& context : {std::string("ab"), std::string("<"), std::string(">"), std::string(" ")}) {
      const std::vector<int32_t> ids = tok.encode(context + s + context);
      EXPECT_EQ(std::count(ids.begin(), ids.end(), id), 1);
      const std::vector<int32_t> ctx = tok.encode(context);
      std::vector<int32_t> expected = ctx;
      expected.push_back(id);
      expected.insert(expected.end(), ctx.begin(), ctx.end());
      EXPECT_EQ(ids, expected);
    }
    // A truncated special string is ordinary text.
    const std::vector<int32_t> partial = tok.encode(s.substr(0, s.size() - 1));
    for (int32_t p : partial) EXPECT_GE(p, 12);
  }
  EXPECT_EQ(tok.encode("<|turn><turn|><eos><eos>"), (std::vector<int32_t>{7, 8, 1, 1}));
}

TEST_P(Backends, CompletionEosIsNotDoubled) {
  const Tokenizer& tok = loaded(GetParam());
  EXPECT_EQ(tok.completionTokens(""), std::vector<int32_t>{1});
  EXPECT_EQ(tok.completionTokens("<eos>"), std::vector<int32_t>{1});
  std::vector<int32_t> done = tok.encode("Done.");
  std::vector<int32_t> withEos = done;
  withEos.push_back(1);
  EXPECT_EQ(tok.completionTokens("Done."), withEos);
  EXPECT_EQ(tok.completionTokens("Done.<eos>"), withEos);
  // Only a trailing EOS counts.
  std::vector<int32_t> inner = tok.encode("a<eos>b");
  inner.push_back(1);
  EXPECT_EQ(tok.completionTokens("a<eos>b"), inner);
  EXPECT_EQ(std::count(inner.begin(), inner.end(), 1), 2);
}

TEST_P(Backends, PromptStructureThinkingOff) {
  const Tokenizer& tok = loaded(GetParam());
  std::vector<Message> messages(1);
  messages[0].content.push_back({ContentPart::Text, "Hi", ""});
  const TokenizedPrompt prompt = renderGemma4Prompt(tok, messages, {});
  std::vector<int32_t> expected = {2, 7};
  for (const char* piece : {"user\n"}) {
    auto ids = tok.encode(piece);
    expected.insert(expected.end(), ids.begin(), ids.end());
  }
  auto hi = tok.encode("Hi");
  expected.insert(expected.end(), hi.begin(), hi.end());
  expected.insert(expected.end(), {8, 12, 7});
  auto model = tok.encode("model\n");
  expected.insert(expected.end(), model.begin(), model.end());
  expected.push_back(9);
  auto thought = tok.encode("thought\n");
  expected.insert(expected.end(), thought.begin(), thought.end());
  expected.push_back(10);
  EXPECT_EQ(prompt.inputIds, expected);
  EXPECT_EQ(prompt.mmTokenTypeIds, std::vector<int32_t>(expected.size(), 0));
}

TEST_P(Backends, ImageTokensAreMarked) {
  const Tokenizer& tok = loaded(GetParam());
  std::vector<Message> messages(1);
  messages[0].content.push_back({ContentPart::Image, "", "/x.png"});
  messages[0].content.push_back({ContentPart::Text, "What?", ""});
  const TokenizedPrompt prompt = renderGemma4Prompt(tok, messages, {3});
  ASSERT_EQ(prompt.inputIds.size(), prompt.mmTokenTypeIds.size());
  int images = 0;
  for (size_t i = 0; i < prompt.inputIds.size(); ++i) {
    EXPECT_EQ(prompt.mmTokenTypeIds[i], prompt.inputIds[i] == 4 ? 1 : 0);
    images += prompt.inputIds[i] == 4;
  }
  EXPECT_EQ(images, 3);
  const std::vector<int32_t> sequence = {5, 4, 4, 4, 6};
  EXPECT_NE(std::search(prompt.inputIds.begin(), prompt.inputIds.end(), sequence.begin(), sequence.end()),
            prompt.inputIds.end());
}

TEST_P(Backends, ImageCountErrors) {
  const Tokenizer& tok = loaded(GetParam());
  std::vector<Message> messages(1);
  messages[0].content.push_back({ContentPart::Image, "", "/x.png"});
  EXPECT_NE(expectInputError([&] { renderGemma4Prompt(tok, messages, {}); }).find("1 image parts but 0"),
            std::string::npos);
  EXPECT_NE(expectInputError([&] { renderGemma4Prompt(tok, messages, {0}); }).find("/x.png"), std::string::npos);
  messages[0].content.push_back({ContentPart::Text, "a literal <image> token", ""});
  EXPECT_NE(expectInputError([&] { renderGemma4Prompt(tok, messages, {2}); }).find("3 image tokens"),
            std::string::npos);
}

TEST(Tokenizer, OutOfRangeIdIsAnError) {
  EXPECT_NO_THROW(checkTokenIds({0, 1, 255}, 256, "prompt"));
  const std::string message = expectInputError([] { checkTokenIds({1, 256, 2}, 256, "row 3 prompt"); });
  EXPECT_NE(message.find("row 3 prompt: token id 256 at position 1 is out of range for vocab_size 256"),
            std::string::npos)
      << message;
  EXPECT_NE(expectInputError([] { checkTokenIds({-1}, 256, "c"); }).find("token id -1"), std::string::npos);
  // The bundled tokenizer's ids do not fit a smaller model.
  const std::vector<int32_t> ids = bundled().encode("😀 你好");
  EXPECT_NE(expectInputError([&] { checkTokenIds(ids, 100, "completion"); }).find("out of range"), std::string::npos);
}

TEST(Tokenizer, InvalidTokenizerJsonIsALocatedError) {
  TempDir dir;
  std::ofstream(dir.path / "tokenizer.json") << "{}";
  const std::string message = expectInputError([&] { Tokenizer tok(dir.path.string()); });
  EXPECT_NE(message.find((dir.path / "tokenizer.json").string() + ": (root).model: expected a value"),
            std::string::npos)
      << message;
}

TEST(Tokenizer, MissingTokenizerNamesThePath) {
  TempDir dir;
  const std::string missingDir = (dir.path / "no-such-checkpoint").string();
  std::string message = expectInputError([&] { Tokenizer tok(missingDir); });
  EXPECT_NE(message.find(missingDir), std::string::npos) << message;
  message = expectInputError([&] { Tokenizer tok(dir.path.string()); });
  EXPECT_NE(message.find((dir.path / "tokenizer.model").string()), std::string::npos) << message;
}

TEST(Tokenizer, CorruptModelIsAnInputError) {
  TempDir dir;
  std::ofstream(dir.path / "tokenizer.model") << "not a sentencepiece model";
  const std::string message = expectInputError([&] { Tokenizer tok(dir.path.string()); });
  EXPECT_NE(message.find((dir.path / "tokenizer.model").string()), std::string::npos) << message;
}

TEST(Tokenizer, ConfigNamesTheImageTokens) {
  TempDir dir;
  fs::copy_file(fs::path(DGEMMA_TOKENIZER_DIR) / "tokenizer.model", dir.path / "tokenizer.model");
  std::ofstream(dir.path / "tokenizer_config.json")
      << R"({"image_token": "<boi>", "boi_token": {"content": "<|turn>"}, "eoi_token": "<turn|>"})";
  const Tokenizer tok(dir.path.string());
  EXPECT_EQ(tok.imageTokenId(), 5);
  EXPECT_EQ(tok.boiTokenId(), 7);
  EXPECT_EQ(tok.eoiTokenId(), 8);
}

TEST(Tokenizer, StripsPythonWhitespace) {
  EXPECT_EQ(stripPythonWhitespace(""), "");
  EXPECT_EQ(stripPythonWhitespace(" \t\n"), "");
  EXPECT_EQ(stripPythonWhitespace("  a b \n"), "a b");
  EXPECT_EQ(stripPythonWhitespace("\u3000\u00a0wide\u2003\u00a0"), "wide");
  EXPECT_EQ(stripPythonWhitespace("\x1f"
                                  "x\xc2\x85"),
            "x");  // U+001F, U+0085
  EXPECT_EQ(stripPythonWhitespace("\u200bzero width\u200b"), "\u200bzero width\u200b");  // not whitespace
  EXPECT_EQ(stripPythonWhitespace("é "), "é");
}

}  // namespace
}  // namespace dgemma

namespace dgemma {
namespace {

// Golden strings: transformers' GemmaTokenizer on data/tokenizer, decode(ids, skip_special_tokens=False).
TEST_P(Backends, DecodesAsTransformersDoes) {
  const Tokenizer& tok = loaded(GetParam());
  auto decode = [&](std::vector<int64_t> ids) { return tok.decode(ids); };
  EXPECT_EQ(decode({136, 55, 42, 60, 35, 24, 63, 65, 70, 54, 78, 85, 50, 54, 101, 77, 54, 86, 54, 90, 85, 67}),
            "Hello world, 12 + 30 = 42.");
  EXPECT_EQ(decode({7, 66, 58, 23, 12, 121, 64, 25, 38, 54, 170, 85, 50, 54, 102, 77, 79, 8, 12}),
            "<|turn>user\nWhat is 82 + 50?<turn|>\n");
  EXPECT_EQ(decode({59, 57, 3, 83, 55, 22, 57, 74, 88, 54, 3}), "na<unk>ve café <unk>");
  EXPECT_EQ(decode({2, 1, 0, 3, 12}), "<bos><eos><pad><unk>\n");
  EXPECT_EQ(decode({136, 100000, -1}), "H\xEF\xBF\xBD\xEF\xBF\xBD");  // ids without a piece
}

// Golden strings: tokenizers.Tokenizer.decode(ids, skip_special_tokens=False) of the file, whose
// decoder ends with Strip(" ", 1, 0) (its normalizer prepends "▁").
TEST(Tokenizer, DecodesBytePiecesAndReplacesBrokenUtf8) {
  const Tokenizer tok(std::string(DGEMMA_TOKENIZER_JSON_DIR) + "/byte_fallback");
  EXPECT_EQ(tok.decode(std::vector<int64_t>{318, 314, 230, 134, 176, 309}), "é€x");  // encode("é€x")
  // The byte run <0xC3> <0x61> (ids 4 + byte) is not UTF-8: one U+FFFD per byte.
  EXPECT_EQ(tok.decode(std::vector<int64_t>{4 + 0xC3, 4 + 'a'}), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Tokenizer, DecodeRefusesADecoderItDoesNotImplement) {
  TempDir dir;
  nlohmann::json file =
      nlohmann::json::parse(std::ifstream(std::string(DGEMMA_TOKENIZER_JSON_DIR) + "/tokenizer.json"));
  file["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  std::ofstream(dir.path / "tokenizer.json") << file.dump();
  const Tokenizer tok(dir.path.string());
  EXPECT_FALSE(tok.encode("hi").empty());  // encoding does not read the decoder
  const std::string message = expectInputError([&] { tok.decode(std::vector<int64_t>{136}); });
  EXPECT_NE(message.find("decoder: the decoder step \"Metaspace\" is not supported"), std::string::npos) << message;
}

}  // namespace
}  // namespace dgemma

namespace dgemma {
namespace {

// tokenBytes() is what each id contributes to decode(): concatenating it over ids gives decode(ids)
// whenever the result is well-formed UTF-8.
TEST_P(Backends, TokenBytesConcatenateToDecode) {
  const Tokenizer& tok = loaded(GetParam());
  const std::vector<std::string> bytes = tok.tokenBytes();
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), tok.vocabSize());
  for (const std::string text : {"Hello world, 12 + 30 = 42.", "na\xC3\xAFve caf\xC3\xA9", "{\"a\": [1, 2]}"}) {
    const std::vector<int32_t> ids = tok.encode(text);
    std::string joined;
    for (int32_t id : ids) joined += bytes[id];
    EXPECT_EQ(joined, tok.decode(std::vector<int64_t>(ids.begin(), ids.end()))) << text;
  }
  for (int64_t id = 0; id < tok.vocabSize(); ++id)
    EXPECT_EQ(bytes[id], tok.decode(std::vector<int64_t>{id})) << "id " << id;
}

TEST(Tokenizer, TokenBytesOfBytePiecesAreSingleBytes) {
  const Tokenizer tok(std::string(DGEMMA_TOKENIZER_JSON_DIR) + "/byte_fallback");
  const std::vector<std::string> bytes = tok.tokenBytes();
  EXPECT_EQ(bytes[4 + 0xC3], std::string(1, '\xC3'));
  EXPECT_EQ(bytes[4 + 'a'], "a");
  const std::vector<int64_t> ids{318, 314, 230, 134, 176, 309};
  std::string joined;
  for (int64_t id : ids) joined += bytes[id];
  EXPECT_EQ(joined, " é€x");  // decode() also applies the file's Strip of one leading space
  EXPECT_EQ(tok.decode(ids), "é€x");
}

// Ids 0-11 of the bundled tokenizer are control, unknown or user-defined pieces; so is 12 ("\n",
// user-defined). The rest are ordinary pieces (data/tokenizer/README.md).
TEST_P(Backends, SpecialIdsAreTheControlUnknownAndUserDefinedPieces) {
  const Tokenizer& tok = loaded(GetParam());
  for (int32_t id = 0; id <= 11; ++id) EXPECT_TRUE(tok.isSpecial(id)) << "id " << id;
  for (int32_t id = 13; id < tok.vocabSize(); ++id) EXPECT_FALSE(tok.isSpecial(id)) << "id " << id;
  EXPECT_FALSE(tok.isSpecial(-1));
  EXPECT_FALSE(tok.isSpecial(static_cast<int32_t>(tok.vocabSize())));
}

}  // namespace
}  // namespace dgemma
