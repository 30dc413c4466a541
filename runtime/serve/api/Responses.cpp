#include "runtime/serve/api/Responses.h"

#include <chrono>
#include <random>

#include <nlohmann/json.hpp>

namespace dgemma::serve {
namespace {

using nlohmann::json;

bool isChat(Endpoint endpoint) { return endpoint == Endpoint::ChatCompletions; }

// Generated text is valid UTF-8 (the tokenizer replaces bad bytes with U+FFFD); replacing rather than
// throwing keeps a response from failing on a stray byte all the same.
std::string serialize(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

json header(const ResponseIdentity& identity, const char* object) {
  return {{"id", identity.id}, {"object", object}, {"created", identity.created}, {"model", identity.model}};
}

json usageJson(const Usage& usage) {
  return {{"prompt_tokens", usage.promptTokens},
          {"completion_tokens", usage.completionTokens},
          {"total_tokens", usage.promptTokens + usage.completionTokens}};
}

json finishReasonJson(const std::optional<std::string>& finishReason) {
  return finishReason ? json(*finishReason) : json(nullptr);
}

// A chunk's one choice; `delta` is the chat delta, `text` the completion text.
json chunkChoice(Endpoint endpoint, int64_t index, json delta, const std::string& text,
                 const std::optional<std::string>& finishReason) {
  if (isChat(endpoint)) {
    return {{"index", index},
            {"delta", std::move(delta)},
            {"logprobs", nullptr},
            {"finish_reason", finishReasonJson(finishReason)}};
  }
  return {{"text", text}, {"index", index}, {"logprobs", nullptr}, {"finish_reason", finishReasonJson(finishReason)}};
}

const char* chunkObject(Endpoint endpoint) { return isChat(endpoint) ? "chat.completion.chunk" : "text_completion"; }

}  // namespace

ResponseIdentity newResponseIdentity(Endpoint endpoint, const std::string& model) {
  thread_local std::mt19937_64 random{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string id = isChat(endpoint) ? "chatcmpl-" : "cmpl-";
  for (int half = 0; half < 2; ++half) {
    const uint64_t bits = random();
    for (int digit = 15; digit >= 0; --digit) id.push_back(kHex[bits >> (4 * digit) & 15]);
  }
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {std::move(id), std::chrono::duration_cast<std::chrono::seconds>(now).count(), model};
}

std::string completionJson(const ResponseIdentity& identity, Endpoint endpoint,
                           const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json body = header(identity, isChat(endpoint) ? "chat.completion" : "text_completion");
  json list = json::array();
  for (const ChoiceResult& choice : choices) {
    if (isChat(endpoint)) {
      list.push_back({{"index", choice.index},
                      {"message", {{"role", "assistant"}, {"content", choice.text}}},
                      {"logprobs", nullptr},
                      {"finish_reason", choice.finishReason}});
    } else {
      list.push_back({{"text", choice.text},
                      {"index", choice.index},
                      {"logprobs", nullptr},
                      {"finish_reason", choice.finishReason}});
    }
  }
  body["choices"] = std::move(list);
  body["usage"] = usageJson(usage);
  return serialize(body);
}

std::string chunkJson(const ResponseIdentity& identity, Endpoint endpoint, int64_t index, bool withRole,
                      const std::string& text, const std::optional<std::string>& finishReason) {
  json delta = json::object();
  if (withRole) delta["role"] = "assistant";
  if (withRole || !text.empty()) delta["content"] = text;
  json body = header(identity, chunkObject(endpoint));
  body["choices"] = json::array({chunkChoice(endpoint, index, std::move(delta), text, finishReason)});
  return serialize(body);
}

std::string usageChunkJson(const ResponseIdentity& identity, Endpoint endpoint, const Usage& usage) {
  json body = header(identity, chunkObject(endpoint));
  body["choices"] = json::array();
  body["usage"] = usageJson(usage);
  return serialize(body);
}

std::string draftChunkJson(const ResponseIdentity& identity, Endpoint endpoint, int64_t index, int64_t canvas,
                           int64_t step, const std::string& text) {
  json choice = chunkChoice(endpoint, index, json::object(), "", std::nullopt);
  choice["draft"] = {{"canvas", canvas}, {"step", step}, {"text", text}};
  json body = header(identity, chunkObject(endpoint));
  body["choices"] = json::array({std::move(choice)});
  return serialize(body);
}

std::string sseEvent(const std::string& json) { return "data: " + json + "\n\n"; }

std::string sseDone() { return "data: [DONE]\n\n"; }

std::string modelsJson(const std::vector<std::string>& ids, int64_t created) {
  json data = json::array();
  for (const std::string& id : ids) {
    data.push_back({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "dgemma"}});
  }
  return serialize({{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace dgemma::serve
