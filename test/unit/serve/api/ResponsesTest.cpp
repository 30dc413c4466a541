// The JSON of every response builder, parsed back (docs/serving.md, "Responses"), and SSE framing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "runtime/serve/api/Responses.h"

namespace dgemma::serve {
namespace {

using nlohmann::json;

const ResponseIdentity kIdentity{"chatcmpl-0123", 1700000000, "dgemma-tiny"};

void expectHeader(const json& body, const char* object) {
  EXPECT_EQ(body["id"], kIdentity.id);
  EXPECT_EQ(body["object"], object);
  EXPECT_EQ(body["created"], kIdentity.created);
  EXPECT_EQ(body["model"], kIdentity.model);
}

TEST(ServeResponses, IdentityIsRandomAndCurrent) {
  const ResponseIdentity chat = newResponseIdentity(Endpoint::ChatCompletions, "m");
  const ResponseIdentity other = newResponseIdentity(Endpoint::ChatCompletions, "m");
  const ResponseIdentity text = newResponseIdentity(Endpoint::Completions, "m");
  EXPECT_TRUE(std::regex_match(chat.id, std::regex("chatcmpl-[0-9a-f]{32}"))) << chat.id;
  EXPECT_TRUE(std::regex_match(text.id, std::regex("cmpl-[0-9a-f]{32}"))) << text.id;
  EXPECT_NE(chat.id, other.id);
  EXPECT_EQ(chat.model, "m");
  EXPECT_GT(chat.created, 1700000000);  // after November 2023: a unix time in seconds, not a zero
  EXPECT_LT(chat.created, 100000000000);  // not milliseconds
}

TEST(ServeResponses, ChatCompletion) {
  const json body = json::parse(completionJson(kIdentity, Endpoint::ChatCompletions,
                                               {{0, "Hello", "stop"}, {1, "Hi \xE2\x82\xAC", "length"}}, {12, 7}));
  expectHeader(body, "chat.completion");
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0], json::parse(R"({"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                                "logprobs": null, "finish_reason": "stop"})"));
  EXPECT_EQ(body["choices"][1]["message"]["content"], "Hi \xE2\x82\xAC");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(body["usage"], json::parse(R"({"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19})"));
}

TEST(ServeResponses, TextCompletion) {
  const json body =
      json::parse(completionJson(kIdentity, Endpoint::Completions, {{0, "upon a time", "length"}}, {3, 4}));
  expectHeader(body, "text_completion");
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0],
            json::parse(R"({"text": "upon a time", "index": 0, "logprobs": null, "finish_reason": "length"})"));
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
}

TEST(ServeResponses, ChatChunks) {
  const json first = json::parse(chunkJson(kIdentity, Endpoint::ChatCompletions, 1, true, "", std::nullopt));
  expectHeader(first, "chat.completion.chunk");
  ASSERT_EQ(first["choices"].size(), 1u);
  EXPECT_EQ(first["choices"][0], json::parse(R"({"index": 1, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": null, "finish_reason": null})"));
  EXPECT_FALSE(first.contains("usage"));
  const json middle = json::parse(chunkJson(kIdentity, Endpoint::ChatCompletions, 1, false, "lo", std::nullopt));
  EXPECT_EQ(middle["choices"][0]["delta"], json::parse(R"({"content": "lo"})"));
  EXPECT_TRUE(middle["choices"][0]["finish_reason"].is_null());
  const json last = json::parse(chunkJson(kIdentity, Endpoint::ChatCompletions, 1, false, "", "stop"));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
}

TEST(ServeResponses, TextCompletionChunks) {
  const json chunk = json::parse(chunkJson(kIdentity, Endpoint::Completions, 2, true, "abc", "length"));
  expectHeader(chunk, "text_completion");
  EXPECT_EQ(chunk["choices"][0],
            json::parse(R"({"text": "abc", "index": 2, "logprobs": null, "finish_reason": "length"})"));
}

TEST(ServeResponses, UsageChunk) {
  for (Endpoint endpoint : {Endpoint::ChatCompletions, Endpoint::Completions}) {
    const json chunk = json::parse(usageChunkJson(kIdentity, endpoint, {5, 6}));
    expectHeader(chunk, endpoint == Endpoint::ChatCompletions ? "chat.completion.chunk" : "text_completion");
    EXPECT_EQ(chunk["choices"], json::array());
    EXPECT_EQ(chunk["usage"], json::parse(R"({"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11})"));
  }
}

TEST(ServeResponses, DraftChunk) {
  const json chat = json::parse(draftChunkJson(kIdentity, Endpoint::ChatCompletions, 0, 2, 5, "The c_t"));
  expectHeader(chat, "chat.completion.chunk");
  EXPECT_EQ(chat["choices"][0], json::parse(R"({"index": 0, "delta": {}, "logprobs": null, "finish_reason": null,
                                                "draft": {"canvas": 2, "step": 5, "text": "The c_t"}})"));
  const json text = json::parse(draftChunkJson(kIdentity, Endpoint::Completions, 1, 0, 0, "x"));
  EXPECT_EQ(text["choices"][0], json::parse(R"({"text": "", "index": 1, "logprobs": null, "finish_reason": null,
                                                "draft": {"canvas": 0, "step": 0, "text": "x"}})"));
}

TEST(ServeResponses, InvalidUtf8IsReplacedNotThrown) {
  const json body = json::parse(chunkJson(kIdentity, Endpoint::Completions, 0, false, "a\xC3", std::nullopt));
  EXPECT_EQ(body["choices"][0]["text"], "a\xEF\xBF\xBD");
}

TEST(ServeResponses, ServerSentEvents) {
  EXPECT_EQ(sseEvent(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sseDone(), "data: [DONE]\n\n");
}

TEST(ServeResponses, Models) {
  const json body = json::parse(modelsJson({"dgemma-tiny", "adapter-a"}, 1700000001));
  EXPECT_EQ(body, json::parse(R"({"object": "list", "data": [
      {"id": "dgemma-tiny", "object": "model", "created": 1700000001, "owned_by": "dgemma"},
      {"id": "adapter-a", "object": "model", "created": 1700000001, "owned_by": "dgemma"}]})"));
  EXPECT_EQ(json::parse(modelsJson({}, 0))["data"], json::array());
}

}  // namespace
}  // namespace dgemma::serve
