// The response bodies of dgemma-serve (docs/serving.md, "Responses"), in the shapes of OpenAI's API
// reference:
//
//   chat.completion        {id, object, created, model, choices: [{index, message: {role, content},
//                           logprobs: null, finish_reason}], usage: {prompt_tokens, completion_tokens,
//                           total_tokens}}
//   chat.completion.chunk  {id, object, created, model, choices: [{index, delta, logprobs: null,
//                           finish_reason}]}; delta {"role": "assistant", "content": ...} on a choice's
//                           first chunk, {"content": ...} after, {} on a last chunk without text
//   text_completion        {id, object, created, model, choices: [{text, index, logprobs: null,
//                           finish_reason}], usage}; its chunks have the same object and choices
//
// finish_reason is "stop" or "length", null in a chunk until the choice's last. With
// stream_options.include_usage the stream ends with a chunk whose choices are [] and which carries
// usage, then "data: [DONE]".
//
// Extension (stream_options.include_drafts): after a denoising step, a chunk shows the draft of the
// canvas being denoised. Its choice has an empty delta (chat) or empty text (completions) and
// finish_reason null, so it adds nothing to the text a client accumulates, plus
//
//   "draft": {"canvas": C, "step": S, "text": "the canvas's current draft"}
//
// C counts the choice's canvases from 0, S the denoising steps within that canvas from 0. Clients
// that do not know the field ignore it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/serve/api/Request.h"

namespace dgemma::serve {

struct ResponseIdentity {
  std::string id;  // "chatcmpl-<hex>" / "cmpl-<hex>"
  int64_t created = 0;  // unix time, seconds
  std::string model;
};

// A random id (32 hex digits) and the current unix time.
ResponseIdentity newResponseIdentity(Endpoint endpoint, const std::string& model);

struct Usage {
  int64_t promptTokens = 0, completionTokens = 0;
};

struct ChoiceResult {
  int64_t index = 0;
  std::string text;
  std::string finishReason;  // "stop" | "length"
};

std::string completionJson(const ResponseIdentity& identity, Endpoint endpoint,
                           const std::vector<ChoiceResult>& choices, const Usage& usage);
// One choice's delta; the role only on a chat choice's first chunk (withRole); finishReason on its last.
std::string chunkJson(const ResponseIdentity& identity, Endpoint endpoint, int64_t index, bool withRole,
                      const std::string& text, const std::optional<std::string>& finishReason);
// choices: [] and usage.
std::string usageChunkJson(const ResponseIdentity& identity, Endpoint endpoint, const Usage& usage);
// The draft chunk of the extension above.
std::string draftChunkJson(const ResponseIdentity& identity, Endpoint endpoint, int64_t index, int64_t canvas,
                           int64_t step, const std::string& text);

std::string sseEvent(const std::string& json);  // "data: JSON\n\n"
std::string sseDone();                          // "data: [DONE]\n\n"

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by": "dgemma"}]}.
std::string modelsJson(const std::vector<std::string>& ids, int64_t created);

}  // namespace dgemma::serve
