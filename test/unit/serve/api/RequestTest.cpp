// Request parsing and validation (docs/serving.md, "Requests"): every parameter's accepted values,
// its type and range errors (status, param, message), unsupported OpenAI fields and malformed JSON.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/serve/api/Request.h"
#include "test/unit/TestSupport.h"
#include "test/unit/serve/api/ExpectApiError.h"

namespace dgemma::serve {
namespace {

using dgemma::test::mentions;
using test::expectApiError;

const MediaPolicy kNoLocalMedia;

// A chat body with one user message, plus `fields` (",\"n\": 2") at the top level.
std::string chatBody(const std::string& fields) {
  return R"({"model": "dgemma", "messages": [{"role": "user", "content": "hi"}])" + fields + "}";
}

CompletionRequest chat(const std::string& fields) {
  return parseCompletionRequest(chatBody(fields), Endpoint::ChatCompletions, kNoLocalMedia);
}

CompletionRequest completion(const std::string& body) {
  return parseCompletionRequest(body, Endpoint::Completions, kNoLocalMedia);
}

ApiError chatError(const std::string& fields) {
  return expectApiError([&] { chat(fields); });
}

// The error of a chat body with `fields` is a 400 invalid_request_error naming `param`, and its
// message starts with the param and mentions `what`.
void expectRefused(const std::string& fields, const std::string& param, const std::string& what) {
  SCOPED_TRACE(fields);
  const ApiError error = chatError(fields);
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_EQ(error.param, param);
  EXPECT_TRUE(mentions(error.what(), param + ": ")) << error.what();
  EXPECT_TRUE(mentions(error.what(), what));
}

TEST(ServeRequest, Defaults) {
  const CompletionRequest request = chat("");
  EXPECT_EQ(request.endpoint, Endpoint::ChatCompletions);
  EXPECT_EQ(request.model, "dgemma");
  EXPECT_FALSE(request.maxTokens.has_value());
  EXPECT_EQ(request.temperature, 1.0);
  EXPECT_EQ(request.topP, 1.0);
  EXPECT_FALSE(request.seed.has_value());
  EXPECT_TRUE(request.stop.empty());
  EXPECT_EQ(request.n, 1);
  EXPECT_FALSE(request.stream);
  EXPECT_FALSE(request.includeUsage);
  EXPECT_FALSE(request.includeDrafts);
  EXPECT_EQ(request.responseFormat.kind, ResponseFormat::Text);
  EXPECT_FALSE(request.denoisingSteps.has_value());
  EXPECT_FALSE(request.entropyBound.has_value());
  ASSERT_EQ(request.messages.size(), 1u);
  EXPECT_EQ(request.messages[0].role, Message::User);
  ASSERT_EQ(request.messages[0].content.size(), 1u);
  EXPECT_EQ(request.messages[0].content[0].text, "hi");
  EXPECT_FALSE(request.messages[0].contentIsList);
  EXPECT_TRUE(request.images.empty());
}

TEST(ServeRequest, EveryParameter) {
  const CompletionRequest request = chat(R"(, "max_completion_tokens": 64, "temperature": 0.5, "top_p": 1,
      "seed": 7, "stop": ["\n\n", "END"], "n": 3, "stream": true,
      "stream_options": {"include_usage": true, "include_drafts": true},
      "response_format": {"type": "json_object"}, "denoising_steps": 32, "entropy_bound": 0.25)");
  EXPECT_EQ(request.maxTokens, 64);
  EXPECT_EQ(request.temperature, 0.5);
  EXPECT_EQ(request.seed, 7u);
  EXPECT_EQ(request.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(request.n, 3);
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.includeUsage);
  EXPECT_TRUE(request.includeDrafts);
  EXPECT_EQ(request.responseFormat.kind, ResponseFormat::JsonObject);
  EXPECT_EQ(request.denoisingSteps, 32);
  EXPECT_EQ(request.entropyBound, 0.25);
}

TEST(ServeRequest, NullIsAnOmittedField) {
  const CompletionRequest request = chat(R"(, "model": null, "max_tokens": null, "temperature": null, "top_p": null,
      "seed": null, "stop": null, "n": null, "stream": null, "stream_options": null, "response_format": null,
      "denoising_steps": null, "entropy_bound": null, "tools": null, "logprobs": null)");
  EXPECT_EQ(request.model, "");
  EXPECT_FALSE(request.maxTokens.has_value());
  EXPECT_EQ(request.temperature, 1.0);
  EXPECT_EQ(request.n, 1);
}

TEST(ServeRequest, UnknownFieldsAndNeutralValuesOfUnsupportedOnesAreAccepted) {
  const CompletionRequest request = chat(R"(, "user": "u1", "metadata": {"a": 1}, "tools": [], "tool_choice": "none",
      "logprobs": false, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
      "n": 2, "best_of": 2, "echo": false, "suffix": "")");
  EXPECT_EQ(request.n, 2);
}

TEST(ServeRequest, MaxTokens) {
  EXPECT_EQ(chat(R"(, "max_tokens": 5)").maxTokens, 5);
  EXPECT_EQ(chat(R"(, "max_completion_tokens": 6)").maxTokens, 6);
  EXPECT_EQ(chat(R"(, "max_completion_tokens": 6, "max_tokens": 6)").maxTokens, 6);
  expectRefused(R"(, "max_completion_tokens": 6, "max_tokens": 7)", "max_completion_tokens", "differs from max_tokens");
  expectRefused(R"(, "max_tokens": 0)", "max_tokens", "expected an integer >= 1, got 0");
  expectRefused(R"(, "max_completion_tokens": -3)", "max_completion_tokens", "expected an integer >= 1, got -3");
  expectRefused(R"(, "max_tokens": 2.5)", "max_tokens", "expected an integer, got number");
  expectRefused(R"(, "max_tokens": "10")", "max_tokens", "expected an integer, got string");
  expectRefused(R"(, "max_tokens": 18446744073709551615)", "max_tokens", "expected an integer below 2^63");
}

TEST(ServeRequest, Temperature) {
  EXPECT_EQ(chat(R"(, "temperature": 0)").temperature, 0.0);
  EXPECT_EQ(chat(R"(, "temperature": 2)").temperature, 2.0);
  expectRefused(R"(, "temperature": 2.5)", "temperature", "expected a number from 0 to 2, got 2.5");
  expectRefused(R"(, "temperature": -0.1)", "temperature", "expected a number from 0 to 2, got -0.1");
  expectRefused(R"(, "temperature": "hot")", "temperature", "expected a number, got string");
}

TEST(ServeRequest, TopPOnlyOne) {
  EXPECT_EQ(chat(R"(, "top_p": 1.0)").topP, 1.0);
  expectRefused(R"(, "top_p": 0.9)", "top_p", "not supported by the diffusion sampler");
  expectRefused(R"(, "top_p": true)", "top_p", "expected a number, got boolean");
}

TEST(ServeRequest, SeedTakesAnyIntegerAndWrapsNegatives) {
  EXPECT_EQ(chat(R"(, "seed": 0)").seed, 0u);
  EXPECT_EQ(chat(R"(, "seed": -1)").seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(chat(R"(, "seed": -9223372036854775808)").seed, uint64_t{1} << 63);
  EXPECT_EQ(chat(R"(, "seed": 18446744073709551615)").seed, std::numeric_limits<uint64_t>::max());
  expectRefused(R"(, "seed": 1.5)", "seed", "expected an integer, got number");
  expectRefused(R"(, "seed": "1")", "seed", "expected an integer, got string");
}

TEST(ServeRequest, Stop) {
  EXPECT_EQ(chat(R"(, "stop": "x")").stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(chat(R"(, "stop": [])").stop.empty());
  EXPECT_EQ(chat(R"(, "stop": ["a", "b", "c", "d"])").stop.size(), 4u);
  expectRefused(R"(, "stop": ["a", "b", "c", "d", "e"])", "stop", "expected at most 4 stop strings, got 5");
  expectRefused(R"(, "stop": "")", "stop", "expected a non-empty string");
  expectRefused(R"(, "stop": ["a", ""])", "stop[1]", "expected a non-empty string");
  expectRefused(R"(, "stop": ["a", 3])", "stop[1]", "expected a string, got number");
  expectRefused(R"(, "stop": 3)", "stop", "expected a string or an array of strings, got number");
}

TEST(ServeRequest, N) {
  EXPECT_EQ(chat(R"(, "n": 16)").n, 16);
  expectRefused(R"(, "n": 0)", "n", "expected an integer from 1 to 16, got 0");
  expectRefused(R"(, "n": 17)", "n", "expected an integer from 1 to 16, got 17");
  expectRefused(R"(, "n": "2")", "n", "expected an integer, got string");
}

TEST(ServeRequest, StreamAndStreamOptions) {
  EXPECT_TRUE(chat(R"(, "stream": true)").stream);
  EXPECT_FALSE(chat(R"(, "stream": true, "stream_options": {})").includeUsage);
  expectRefused(R"(, "stream": "yes")", "stream", "expected a boolean, got string");
  expectRefused(R"(, "stream_options": {"include_usage": true})", "stream_options",
                "only allowed when \"stream\" is true");
  expectRefused(R"(, "stream": false, "stream_options": {})", "stream_options", "only allowed when");
  expectRefused(R"(, "stream": true, "stream_options": [])", "stream_options", "expected an object, got array");
  expectRefused(R"(, "stream": true, "stream_options": {"include_usage": 1})", "stream_options.include_usage",
                "expected a boolean, got number");
  expectRefused(R"(, "stream": true, "stream_options": {"include_drafts": "no"})", "stream_options.include_drafts",
                "expected a boolean, got string");
}

TEST(ServeRequest, ResponseFormat) {
  EXPECT_EQ(chat(R"(, "response_format": {"type": "text"})").responseFormat.kind, ResponseFormat::Text);
  const ResponseFormat schema = chat(R"(, "response_format": {"type": "json_schema", "json_schema":
      {"name": "answer", "strict": true, "schema": {"type": "object", "required": ["a"]}}})")
                                    .responseFormat;
  EXPECT_EQ(schema.kind, ResponseFormat::JsonSchema);
  EXPECT_EQ(schema.name, "answer");
  EXPECT_EQ(schema.schema, nlohmann::ordered_json::parse(R"({"type": "object", "required": ["a"]})"));
  const ResponseFormat anyJson =
      chat(R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "any"}})").responseFormat;
  EXPECT_EQ(anyJson.schema, nlohmann::json::object());
  const ResponseFormat regex = chat(R"(, "response_format": {"type": "regex", "regex": "[0-9]+"})").responseFormat;
  EXPECT_EQ(regex.kind, ResponseFormat::Regex);
  EXPECT_EQ(regex.regex, "[0-9]+");

  expectRefused(R"(, "response_format": "json")", "response_format", "expected an object, got string");
  expectRefused(R"(, "response_format": {})", "response_format.type", "expected a string, got nothing");
  expectRefused(R"(, "response_format": {"type": "xml"})", "response_format.type",
                R"(expected "text", "json_object", "json_schema" or "regex", got "xml")");
  expectRefused(R"(, "response_format": {"type": "json_schema"})", "response_format.json_schema",
                "expected an object, got nothing");
  expectRefused(R"(, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}})",
                "response_format.json_schema.name", "expected a string, got nothing");
  expectRefused(R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}})",
                "response_format.json_schema.schema", "expected an object, got array");
  expectRefused(R"(, "response_format": {"type": "regex", "regex": ""})", "response_format.regex",
                "expected a non-empty regular expression");
  expectRefused(R"(, "response_format": {"type": "regex"})", "response_format.regex", "expected a string, got nothing");
}

TEST(ServeRequest, Extensions) {
  EXPECT_EQ(chat(R"(, "denoising_steps": 1)").denoisingSteps, 1);
  EXPECT_EQ(chat(R"(, "denoising_steps": 4096)").denoisingSteps, 4096);
  expectRefused(R"(, "denoising_steps": 0)", "denoising_steps", "expected an integer from 1 to 4096, got 0");
  expectRefused(R"(, "denoising_steps": 4097)", "denoising_steps", "expected an integer from 1 to 4096, got 4097");
  expectRefused(R"(, "denoising_steps": 8.5)", "denoising_steps", "expected an integer, got number");
  EXPECT_EQ(chat(R"(, "entropy_bound": 3)").entropyBound, 3.0);
  expectRefused(R"(, "entropy_bound": 0)", "entropy_bound", "expected a finite number > 0, got 0");
  expectRefused(R"(, "entropy_bound": -1.5)", "entropy_bound", "expected a finite number > 0, got -1.5");
  expectRefused(R"(, "entropy_bound": "1")", "entropy_bound", "expected a number, got string");
}

TEST(ServeRequest, ModelMustBeAString) {
  EXPECT_EQ(parseCompletionRequest(R"({"messages": [{"role": "user", "content": "x"}]})", Endpoint::ChatCompletions,
                                   kNoLocalMedia)
                .model,
            "");
  expectRefused(R"(, "model": 3)", "model", "expected a string, got number");
}

TEST(ServeRequest, UnsupportedFieldsAreRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"(, "tools": [{"type": "function", "function": {"name": "f"}}])", "tools"},
      {R"(, "tool_choice": "auto")", "tool_choice"},
      {R"(, "functions": [{"name": "f"}])", "functions"},
      {R"(, "function_call": "auto")", "function_call"},
      {R"(, "logprobs": true)", "logprobs"},
      {R"(, "top_logprobs": 2)", "top_logprobs"},
      {R"(, "top_logprobs": 0)", "top_logprobs"},
      {R"(, "presence_penalty": 0.5)", "presence_penalty"},
      {R"(, "frequency_penalty": -1)", "frequency_penalty"},
      {R"(, "logit_bias": {"42": 10})", "logit_bias"},
      {R"(, "best_of": 3)", "best_of"},
      {R"(, "n": 2, "best_of": 1)", "best_of"},
      {R"(, "echo": true)", "echo"},
      {R"(, "suffix": "tail")", "suffix"},
  };
  for (const auto& [fields, param] : cases) expectRefused(fields, param, "not supported by dgemma-serve");
  expectRefused(R"(, "tools": {})", "tools", "expected an array, got object");
  expectRefused(R"(, "logprobs": 1)", "logprobs", "expected a boolean, got number");
  expectRefused(R"(, "presence_penalty": "0")", "presence_penalty", "expected a number, got string");
  expectRefused(R"(, "logit_bias": [])", "logit_bias", "expected an object, got array");
}

TEST(ServeRequest, CompletionsLogprobsIsAnInteger) {
  const ApiError refused = expectApiError([] { completion(R"({"prompt": "a", "logprobs": 1})"); });
  EXPECT_EQ(refused.param, "logprobs");
  EXPECT_TRUE(mentions(refused.what(), "not supported"));
  const ApiError wrongType = expectApiError([] { completion(R"({"prompt": "a", "logprobs": true})"); });
  EXPECT_TRUE(mentions(wrongType.what(), "logprobs: expected an integer, got boolean"));
}

TEST(ServeRequest, MalformedJsonNamesTheByteOffset) {
  const ApiError error =
      expectApiError([] { parseCompletionRequest(R"({"model": x})", Endpoint::ChatCompletions, kNoLocalMedia); });
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.param, "");
  EXPECT_TRUE(mentions(error.what(), "malformed JSON at byte offset 10")) << error.what();  // the x
  const ApiError truncated = expectApiError([] { completion(R"({"prompt": "a")"); });
  EXPECT_TRUE(mentions(truncated.what(), "malformed JSON at byte offset 14")) << truncated.what();  // the end
  const ApiError empty = expectApiError([] { completion(""); });
  EXPECT_TRUE(mentions(empty.what(), "malformed JSON at byte offset 0")) << empty.what();
}

TEST(ServeRequest, NumberBeyondDoubleRange) {
  const ApiError error = chatError(R"(, "entropy_bound": 1e999)");
  EXPECT_EQ(error.status, 400);
  EXPECT_TRUE(mentions(error.what(), "request body: number overflow parsing '1e999'")) << error.what();
}

TEST(ServeRequest, NestingDepthIsLimited) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_EQ(chat(R"(, "extra": )" + nested(100)).n, 1);
  const ApiError error = chatError(R"(, "extra": )" + nested(100000));
  EXPECT_EQ(error.status, 400);
  EXPECT_TRUE(mentions(error.what(), "request body: expected JSON nested at most 128 levels deep")) << error.what();
}

TEST(ServeRequest, BodyMustBeAnObject) {
  const ApiError error = expectApiError([] { completion("[1]"); });
  EXPECT_EQ(error.status, 400);
  EXPECT_TRUE(mentions(error.what(), "request body: expected a JSON object, got array"));
}

TEST(ServeMessages, RolesAndContent) {
  const CompletionRequest request = parseCompletionRequest(
      R"({"messages": [{"role": "developer", "content": "Be terse."},
                       {"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
                       {"role": "user", "content": "Q", "name": "someone"},
                       {"role": "assistant", "content": null},
                       {"role": "assistant", "content": "A", "tool_calls": []}]})",
      Endpoint::ChatCompletions, kNoLocalMedia);
  ASSERT_EQ(request.messages.size(), 5u);
  EXPECT_EQ(request.messages[0].role, Message::System);
  EXPECT_EQ(request.messages[0].content[0].text, "Be terse.");
  EXPECT_EQ(request.messages[1].role, Message::System);
  EXPECT_TRUE(request.messages[1].contentIsList);
  ASSERT_EQ(request.messages[1].content.size(), 2u);
  EXPECT_EQ(request.messages[1].content[1].text, "B");
  EXPECT_EQ(request.messages[2].role, Message::User);
  EXPECT_EQ(request.messages[3].role, Message::Assistant);
  EXPECT_TRUE(request.messages[3].content.empty());
  EXPECT_EQ(request.messages[4].content[0].text, "A");
}

void expectMessagesRefused(const std::string& messages, const std::string& param, const std::string& what) {
  SCOPED_TRACE(messages);
  const ApiError error = expectApiError(
      [&] { parseCompletionRequest(R"({"messages": )" + messages + "}", Endpoint::ChatCompletions, kNoLocalMedia); });
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.param, param);
  EXPECT_TRUE(mentions(error.what(), param + ": " + what));
}

TEST(ServeMessages, Errors) {
  expectMessagesRefused("[]", "messages", "expected at least one message, got an empty array");
  expectMessagesRefused(R"("hi")", "messages", "expected an array of messages, got string");
  expectMessagesRefused(R"([{"role": "user", "content": "a"}, 3])", "messages[1]", "expected an object, got number");
  expectMessagesRefused(R"([{"content": "a"}])", "messages[0].role", "expected a string, got nothing");
  expectMessagesRefused(R"([{"role": "robot", "content": "a"}])", "messages[0].role",
                        R"(expected "system", "developer", "user" or "assistant", got "robot")");
  expectMessagesRefused(R"([{"role": "tool", "content": "a", "tool_call_id": "1"}])", "messages[0].role",
                        R"(role "tool" is not supported)");
  expectMessagesRefused(R"([{"role": "function", "content": "a"}])", "messages[0].role",
                        R"(role "function" is not supported)");
  expectMessagesRefused(R"([{"role": "user"}])", "messages[0].content",
                        "expected a string or an array of content parts, got nothing");
  expectMessagesRefused(R"([{"role": "user", "content": null}])", "messages[0].content",
                        "expected a string or an array of content parts, got null");
  expectMessagesRefused(R"([{"role": "user", "content": 7}])", "messages[0].content",
                        "expected a string or an array of content parts, got number");
  expectMessagesRefused(R"([{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}])",
                        "messages[0].content[1]", "expected an object, got string");
  expectMessagesRefused(R"([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}])",
                        "messages[0].content[0].type", R"(expected "text" or "image_url", got "input_audio")");
  expectMessagesRefused(R"([{"role": "user", "content": [{"text": "a"}]}])", "messages[0].content[0].type",
                        "expected a string, got nothing");
  expectMessagesRefused(R"([{"role": "user", "content": [{"type": "text", "text": 1}]}])",
                        "messages[0].content[0].text", "expected a string, got number");
  expectMessagesRefused(R"([{"role": "user", "content": [{"type": "image_url", "image_url": 5}]}])",
                        "messages[0].content[0].image_url",
                        "expected an object with a \"url\" or a string, got number");
  expectMessagesRefused(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])",
                        "messages[0].content[0].image_url.url", "expected a string, got nothing");
  expectMessagesRefused(R"([{"role": "assistant", "content": "a", "tool_calls": [{"id": "1"}]}])",
                        "messages[0].tool_calls", "not supported by dgemma-serve");
}

TEST(ServePrompt, Forms) {
  EXPECT_EQ(completion(R"({"prompt": "Once"})").prompt, "Once");
  EXPECT_EQ(completion(R"({"prompt": ""})").prompt, "");
  EXPECT_EQ(completion(R"({"prompt": ["Once"]})").prompt, "Once");
  const CompletionRequest ids = completion(R"({"prompt": [5, 0, 9]})");
  EXPECT_EQ(ids.promptTokenIds, (std::vector<int64_t>{5, 0, 9}));
  EXPECT_EQ(ids.prompt, "");
  EXPECT_EQ(completion(R"({"prompt": [[7, 8]]})").promptTokenIds, (std::vector<int64_t>{7, 8}));
  const CompletionRequest request = completion(R"({"prompt": "x", "max_tokens": 3, "stop": "y"})");
  EXPECT_EQ(request.endpoint, Endpoint::Completions);
  EXPECT_EQ(request.maxTokens, 3);
  EXPECT_TRUE(request.messages.empty());
}

void expectPromptRefused(const std::string& body, const std::string& param, const std::string& what) {
  SCOPED_TRACE(body);
  const ApiError error = expectApiError([&] { completion(body); });
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.param, param);
  EXPECT_TRUE(mentions(error.what(), param + ": " + what));
}

TEST(ServePrompt, Errors) {
  expectPromptRefused("{}", "prompt",
                      "expected a string, an array of one string or an array of token ids, got nothing");
  expectPromptRefused(R"({"prompt": 3})", "prompt",
                      "expected a string, an array of one string or an array of token ids, got number");
  expectPromptRefused(R"({"prompt": []})", "prompt",
                      "expected a string, an array of one string or an array of token ids, got an empty array");
  expectPromptRefused(R"({"prompt": ["a", "b"]})", "prompt", "expected one prompt, got 2");
  expectPromptRefused(R"({"prompt": [[1], [2]]})", "prompt", "expected one prompt, got 2");
  expectPromptRefused(R"({"prompt": [1, -2]})", "prompt[1]", "expected an integer >= 0, got -2");
  expectPromptRefused(R"({"prompt": [1, "a"]})", "prompt[1]", "expected an integer, got string");
  expectPromptRefused(R"({"prompt": [1.5]})", "prompt[0]", "expected an integer, got number");
  expectPromptRefused(R"({"prompt": [[]]})", "prompt[0]", "expected at least one token id");
  expectPromptRefused(R"({"prompt": [{}]})", "prompt[0]", "expected a string, a token id or an array of token ids");
}

TEST(ServeErrorJson, Shape) {
  const nlohmann::json body = nlohmann::json::parse(errorJson(badRequest("n: expected ...", "n")));
  EXPECT_EQ(body, nlohmann::json::parse(R"({"error": {"message": "n: expected ...", "type": "invalid_request_error",
                                                      "param": "n", "code": null}})"));
  const nlohmann::json custom =
      nlohmann::json::parse(errorJson(ApiError(404, "not_found_error", "m", "", "model_not_found")));
  EXPECT_TRUE(custom["error"]["param"].is_null());
  EXPECT_EQ(custom["error"]["code"], "model_not_found");
}

TEST(ServeErrorJson, TypeFollowsTheStatus) {
  const std::pair<int, const char*> cases[] = {
      {400, "invalid_request_error"}, {401, "authentication_error"},      {403, "permission_error"},
      {404, "not_found_error"},       {413, "invalid_request_error"},     {429, "rate_limit_error"},
      {500, "server_error"},          {503, "service_unavailable_error"},
  };
  for (const auto& [status, type] : cases) {
    const nlohmann::json body = nlohmann::json::parse(errorJson(status, "what happened"));
    EXPECT_EQ(body["error"]["type"], type) << status;
    EXPECT_EQ(body["error"]["message"], "what happened");
    EXPECT_TRUE(body["error"]["param"].is_null());
    if (status == 413) {
      EXPECT_EQ(body["error"]["code"], "request_too_large");
    } else {
      EXPECT_TRUE(body["error"]["code"].is_null()) << status;
    }
  }
}

}  // namespace
}  // namespace dgemma::serve
