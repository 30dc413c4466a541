#include "runtime/serve/api/Request.h"

#include <cmath>
#include <limits>

namespace dgemma::serve {
namespace {

// Ordered, so that a JSON schema's properties keep the order the client wrote them in (the
// structured output emits them in that order: docs/serving.md, "Structured output").
using json = nlohmann::ordered_json;

constexpr int64_t kMaxChoices = 16;
constexpr size_t kMaxStopStrings = 4;
constexpr int64_t kMaxDenoisingSteps = 4096;
constexpr int kMaxNestingDepth = 128;

std::string typeName(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "number";
  }
}

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw badRequest(path + ": " + what, path); }

[[noreturn]] void failType(const std::string& path, const std::string& expected, const json& value) {
  fail(path, "expected " + expected + ", got " + typeName(value));
}

std::string shown(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// The member `key` of `object`, or nullptr when it is absent or null (an optional field left out).
const json* optionalField(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const json& requiredField(const json& object, const char* key, const std::string& path, const std::string& expected) {
  const json* value = optionalField(object, key);
  if (value == nullptr) fail(path, "expected " + expected + ", got " + (object.contains(key) ? "null" : "nothing"));
  return *value;
}

std::string stringValue(const json& value, const std::string& path) {
  if (!value.is_string()) failType(path, "a string", value);
  return value.get<std::string>();
}

bool boolValue(const json& value, const std::string& path) {
  if (!value.is_boolean()) failType(path, "a boolean", value);
  return value.get<bool>();
}

double numberValue(const json& value, const std::string& path) {
  if (!value.is_number()) failType(path, "a number", value);
  return value.get<double>();
}

int64_t integerValue(const json& value, const std::string& path) {
  if (!value.is_number_integer()) failType(path, "an integer", value);
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    fail(path, "expected an integer below 2^63, got " + shown(value));
  }
  return value.get<int64_t>();
}

int64_t integerInRange(const json& value, const std::string& path, int64_t low, int64_t high) {
  const int64_t number = integerValue(value, path);
  if (number < low || number > high) {
    const std::string range = high == std::numeric_limits<int64_t>::max()
                                  ? ">= " + std::to_string(low)
                                  : "from " + std::to_string(low) + " to " + std::to_string(high);
    fail(path, "expected an integer " + range + ", got " + shown(value));
  }
  return number;
}

const json& objectValue(const json& value, const std::string& path) {
  if (!value.is_object()) failType(path, "an object", value);
  return value;
}

[[noreturn]] void unsupported(const std::string& field, const std::string& why) {
  fail(field, "not supported by dgemma-serve (" + why + ")");
}

// Fields of OpenAI's API that dgemma cannot honour: refused by name rather than silently ignored.
void refuseUnsupportedFields(const json& root, Endpoint endpoint) {
  if (const json* tools = optionalField(root, "tools")) {
    if (!tools->is_array()) failType("tools", "an array", *tools);
    if (!tools->empty()) unsupported("tools", "no tool calling");
  }
  if (const json* toolChoice = optionalField(root, "tool_choice")) {
    if (!(toolChoice->is_string() && toolChoice->get<std::string>() == "none")) {
      unsupported("tool_choice", "no tool calling; only \"none\" is accepted");
    }
  }
  if (optionalField(root, "functions")) unsupported("functions", "no function calling");
  if (optionalField(root, "function_call")) unsupported("function_call", "no function calling");
  if (const json* logprobs = optionalField(root, "logprobs")) {
    if (endpoint == Endpoint::ChatCompletions) {
      if (boolValue(*logprobs, "logprobs"))
        unsupported("logprobs", "the diffusion sampler reports no log probabilities");
    } else {
      integerValue(*logprobs, "logprobs");
      unsupported("logprobs", "the diffusion sampler reports no log probabilities");
    }
  }
  if (const json* topLogprobs = optionalField(root, "top_logprobs")) {
    integerValue(*topLogprobs, "top_logprobs");
    unsupported("top_logprobs", "the diffusion sampler reports no log probabilities");
  }
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    if (const json* value = optionalField(root, penalty)) {
      if (numberValue(*value, penalty) != 0) unsupported(penalty, "only 0 is accepted");
    }
  }
  if (const json* logitBias = optionalField(root, "logit_bias")) {
    if (!objectValue(*logitBias, "logit_bias").empty()) unsupported("logit_bias", "only an empty object is accepted");
  }
  if (const json* echo = optionalField(root, "echo")) {
    if (boolValue(*echo, "echo")) unsupported("echo", "the prompt is not echoed");
  }
  if (const json* suffix = optionalField(root, "suffix")) {
    if (!stringValue(*suffix, "suffix").empty()) unsupported("suffix", "no insertion after a suffix");
  }
}

ContentPart textPart(std::string text) {
  ContentPart part;
  part.text = std::move(text);
  return part;
}

void parseContentPart(const json& value, const std::string& path, const MediaPolicy& media, Message& message,
                      std::vector<RgbImage>& images) {
  objectValue(value, path);
  const std::string type = stringValue(requiredField(value, "type", path + ".type", "a string"), path + ".type");
  if (type == "text") {
    message.content.push_back(
        textPart(stringValue(requiredField(value, "text", path + ".text", "a string"), path + ".text")));
  } else if (type == "image_url") {
    const std::string imagePath = path + ".image_url";
    const json& imageUrl = requiredField(value, "image_url", imagePath, "an object with a \"url\"");
    std::string urlPath = imagePath;
    const json* url = &imageUrl;
    if (imageUrl.is_object()) {
      urlPath += ".url";
      url = &requiredField(imageUrl, "url", urlPath, "a string");
    } else if (!imageUrl.is_string()) {
      failType(imagePath, "an object with a \"url\" or a string", imageUrl);
    }
    images.push_back(loadImageUrl(stringValue(*url, urlPath), media, urlPath));
    ContentPart part;
    part.kind = ContentPart::Image;
    message.content.push_back(std::move(part));
  } else {
    fail(path + ".type", "expected \"text\" or \"image_url\", got \"" + type + "\"");
  }
}

Message parseMessage(const json& value, const std::string& path, const MediaPolicy& media,
                     std::vector<RgbImage>& images) {
  objectValue(value, path);
  const std::string rolePath = path + ".role";
  const std::string role = stringValue(requiredField(value, "role", rolePath, "a string"), rolePath);
  Message message;
  if (role == "system" || role == "developer") {
    message.role = Message::System;
  } else if (role == "user") {
    message.role = Message::User;
  } else if (role == "assistant") {
    message.role = Message::Assistant;
  } else if (role == "tool" || role == "function") {
    fail(rolePath, "role \"" + role + "\" is not supported by dgemma-serve (no tool calling)");
  } else {
    fail(rolePath, "expected \"system\", \"developer\", \"user\" or \"assistant\", got \"" + role + "\"");
  }
  if (const json* toolCalls = optionalField(value, "tool_calls")) {
    if (!toolCalls->is_array() || !toolCalls->empty()) unsupported(path + ".tool_calls", "no tool calling");
  }
  const std::string contentPath = path + ".content";
  const json* content = optionalField(value, "content");
  if (content == nullptr) {
    // OpenAI lets an assistant message leave its content out (it then carries tool calls or a refusal).
    if (message.role == Message::Assistant) return message;
    fail(contentPath, std::string("expected a string or an array of content parts, got ") +
                          (value.contains("content") ? "null" : "nothing"));
  }
  if (content->is_string()) {
    message.content.push_back(textPart(content->get<std::string>()));
  } else if (content->is_array()) {
    message.contentIsList = true;
    for (size_t i = 0; i < content->size(); ++i) {
      parseContentPart((*content)[i], contentPath + "[" + std::to_string(i) + "]", media, message, images);
    }
  } else {
    failType(contentPath, "a string or an array of content parts", *content);
  }
  return message;
}

void parseMessages(const json& root, const MediaPolicy& media, CompletionRequest& request) {
  const json& messages = requiredField(root, "messages", "messages", "an array of messages");
  if (!messages.is_array()) failType("messages", "an array of messages", messages);
  if (messages.empty()) fail("messages", "expected at least one message, got an empty array");
  for (size_t i = 0; i < messages.size(); ++i) {
    request.messages.push_back(parseMessage(messages[i], "messages[" + std::to_string(i) + "]", media, request.images));
  }
}

std::vector<int64_t> tokenIds(const json& array, const std::string& path) {
  std::vector<int64_t> ids;
  if (array.empty()) fail(path, "expected at least one token id, got an empty array");
  for (size_t i = 0; i < array.size(); ++i) {
    ids.push_back(
        integerInRange(array[i], path + "[" + std::to_string(i) + "]", 0, std::numeric_limits<int64_t>::max()));
  }
  return ids;
}

void parsePrompt(const json& root, CompletionRequest& request) {
  constexpr const char* kExpected = "a string, an array of one string or an array of token ids";
  const json& prompt = requiredField(root, "prompt", "prompt", kExpected);
  if (prompt.is_string()) {
    request.prompt = prompt.get<std::string>();
    return;
  }
  if (!prompt.is_array()) failType("prompt", kExpected, prompt);
  if (prompt.empty()) fail("prompt", std::string("expected ") + kExpected + ", got an empty array");
  const json& first = prompt[0];
  if (first.is_number()) {
    request.promptTokenIds = tokenIds(prompt, "prompt");
    return;
  }
  if (prompt.size() > 1 && (first.is_string() || first.is_array())) {
    fail("prompt", "expected one prompt, got " + std::to_string(prompt.size()) +
                       " (batched prompts are not supported; send one request per prompt)");
  }
  if (first.is_string()) {
    request.prompt = first.get<std::string>();
  } else if (first.is_array()) {
    request.promptTokenIds = tokenIds(first, "prompt[0]");
  } else {
    failType("prompt[0]", "a string, a token id or an array of token ids", first);
  }
}

void parseMaxTokens(const json& root, CompletionRequest& request) {
  const int64_t kAny = std::numeric_limits<int64_t>::max();
  std::optional<int64_t> maxCompletionTokens, maxTokens;
  if (const json* value = optionalField(root, "max_completion_tokens")) {
    maxCompletionTokens = integerInRange(*value, "max_completion_tokens", 1, kAny);
  }
  if (const json* value = optionalField(root, "max_tokens")) maxTokens = integerInRange(*value, "max_tokens", 1, kAny);
  if (maxCompletionTokens && maxTokens && *maxCompletionTokens != *maxTokens) {
    fail("max_completion_tokens", "differs from max_tokens (" + std::to_string(*maxCompletionTokens) + " and " +
                                      std::to_string(*maxTokens) + "); give one of them");
  }
  request.maxTokens = maxCompletionTokens ? maxCompletionTokens : maxTokens;
}

void parseStop(const json& root, CompletionRequest& request) {
  const json* stop = optionalField(root, "stop");
  if (stop == nullptr) return;
  auto nonEmpty = [](const json& value, const std::string& path) {
    std::string text = stringValue(value, path);
    if (text.empty()) fail(path, "expected a non-empty string, got \"\"");
    return text;
  };
  if (stop->is_string()) {
    request.stop.push_back(nonEmpty(*stop, "stop"));
    return;
  }
  if (!stop->is_array()) failType("stop", "a string or an array of strings", *stop);
  if (stop->size() > kMaxStopStrings) {
    fail("stop",
         "expected at most " + std::to_string(kMaxStopStrings) + " stop strings, got " + std::to_string(stop->size()));
  }
  for (size_t i = 0; i < stop->size(); ++i)
    request.stop.push_back(nonEmpty((*stop)[i], "stop[" + std::to_string(i) + "]"));
}

void parseStreaming(const json& root, CompletionRequest& request) {
  if (const json* stream = optionalField(root, "stream")) request.stream = boolValue(*stream, "stream");
  const json* options = optionalField(root, "stream_options");
  if (options == nullptr) return;
  objectValue(*options, "stream_options");
  if (!request.stream) fail("stream_options", "only allowed when \"stream\" is true");
  if (const json* value = optionalField(*options, "include_usage")) {
    request.includeUsage = boolValue(*value, "stream_options.include_usage");
  }
  if (const json* value = optionalField(*options, "include_drafts")) {
    request.includeDrafts = boolValue(*value, "stream_options.include_drafts");
  }
}

ResponseFormat parseResponseFormat(const json& value) {
  objectValue(value, "response_format");
  const std::string type =
      stringValue(requiredField(value, "type", "response_format.type", "a string"), "response_format.type");
  ResponseFormat format;
  if (type == "text") {
    format.kind = ResponseFormat::Text;
  } else if (type == "json_object") {
    format.kind = ResponseFormat::JsonObject;
  } else if (type == "json_schema") {
    format.kind = ResponseFormat::JsonSchema;
    const std::string path = "response_format.json_schema";
    const json& jsonSchema = objectValue(requiredField(value, "json_schema", path, "an object"), path);
    format.name = stringValue(requiredField(jsonSchema, "name", path + ".name", "a string"), path + ".name");
    // OpenAI makes the schema optional; without one any JSON value is allowed (the empty schema).
    format.schema = json::object();
    if (const json* schema = optionalField(jsonSchema, "schema"))
      format.schema = objectValue(*schema, path + ".schema");
  } else if (type == "regex") {
    format.kind = ResponseFormat::Regex;
    format.regex =
        stringValue(requiredField(value, "regex", "response_format.regex", "a string"), "response_format.regex");
    if (format.regex.empty()) fail("response_format.regex", "expected a non-empty regular expression, got \"\"");
  } else {
    fail("response_format.type",
         "expected \"text\", \"json_object\", \"json_schema\" or \"regex\", got \"" + type + "\"");
  }
  return format;
}

void parseSampling(const json& root, CompletionRequest& request) {
  if (const json* value = optionalField(root, "temperature")) {
    request.temperature = numberValue(*value, "temperature");
    if (!(request.temperature >= 0 && request.temperature <= 2)) {
      fail("temperature", "expected a number from 0 to 2, got " + shown(*value));
    }
  }
  if (const json* value = optionalField(root, "top_p")) {
    request.topP = numberValue(*value, "top_p");
    if (request.topP != 1) {
      fail("top_p",
           "expected 1, got " + shown(*value) + ": nucleus sampling is not supported by the diffusion sampler");
    }
  }
  if (const json* value = optionalField(root, "seed")) {
    if (!value->is_number_integer()) failType("seed", "an integer", *value);
    request.seed = value->is_number_unsigned() ? value->get<uint64_t>() : static_cast<uint64_t>(value->get<int64_t>());
  }
  if (const json* value = optionalField(root, "n")) request.n = integerInRange(*value, "n", 1, kMaxChoices);
  if (const json* value = optionalField(root, "best_of")) {
    const int64_t bestOf = integerValue(*value, "best_of");
    if (bestOf != request.n) unsupported("best_of", "only best_of equal to n is accepted");
  }
  if (const json* value = optionalField(root, "denoising_steps")) {
    request.denoisingSteps = integerInRange(*value, "denoising_steps", 1, kMaxDenoisingSteps);
  }
  if (const json* value = optionalField(root, "entropy_bound")) {
    const double bound = numberValue(*value, "entropy_bound");
    if (!(bound > 0 && std::isfinite(bound)))
      fail("entropy_bound", "expected a finite number > 0, got " + shown(*value));
    request.entropyBound = bound;
  }
}

json parseBody(std::string_view body) {
  // Copying and destroying a JSON value recurses once per level: a body nested a million levels deep
  // would overflow the stack. Real requests (JSON Schemas included) stay far below this.
  const json::parser_callback_t limitDepth = [](int depth, json::parse_event_t event, json&) {
    const bool opens = event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && depth >= kMaxNestingDepth) {
      throw badRequest("request body: expected JSON nested at most " + std::to_string(kMaxNestingDepth) +
                       " levels deep");
    }
    return true;
  };
  try {
    return json::parse(body, limitDepth);
  } catch (const json::parse_error& error) {
    // nlohmann counts the bytes read, the offending one included; the offset is 0-based.
    const size_t offset = error.byte > 0 ? error.byte - 1 : 0;
    std::string detail = error.what();
    if (const size_t colon = detail.find(": "); colon != std::string::npos) detail = detail.substr(colon + 2);
    throw badRequest("request body: malformed JSON at byte offset " + std::to_string(offset) + ": " + detail);
  } catch (const json::out_of_range& error) {
    // A number beyond double's range ("1e999"); nlohmann does not say where.
    std::string detail = error.what();
    if (const size_t bracket = detail.find("] "); bracket != std::string::npos) detail = detail.substr(bracket + 2);
    throw badRequest("request body: " + detail);
  }
}

}  // namespace

CompletionRequest parseCompletionRequest(std::string_view body, Endpoint endpoint, const MediaPolicy& media) {
  const json root = parseBody(body);
  if (!root.is_object()) throw badRequest("request body: expected a JSON object, got " + typeName(root));
  CompletionRequest request;
  request.endpoint = endpoint;
  if (const json* model = optionalField(root, "model")) request.model = stringValue(*model, "model");
  refuseUnsupportedFields(root, endpoint);
  parseMaxTokens(root, request);
  parseSampling(root, request);
  parseStop(root, request);
  parseStreaming(root, request);
  if (const json* format = optionalField(root, "response_format"))
    request.responseFormat = parseResponseFormat(*format);
  // Images last: decoding is the expensive part, and a cheap error elsewhere should not wait for it.
  if (endpoint == Endpoint::ChatCompletions) {
    parseMessages(root, media, request);
  } else {
    parsePrompt(root, request);
  }
  return request;
}

}  // namespace dgemma::serve
