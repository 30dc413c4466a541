// The request bodies of POST /v1/chat/completions and POST /v1/completions (docs/serving.md,
// "Requests"), parsed and validated into a CompletionRequest.
//
// Every error is an ApiError 400 whose `param` is the JSON path of the offending value
// ("messages[1].content[0].image_url.url") and whose message starts with that path and says what
// was expected ("messages[1].content: expected a string or an array of content parts, got number").
// Malformed JSON is a 400 naming the byte offset; so is JSON nested over 128 levels deep. Unknown
// top-level fields are ignored, as vLLM does; known OpenAI fields dgemma cannot honour are a 400 naming
// them rather than silently ignored: a non-empty tools, tool_choice other than "none", functions,
// function_call, logprobs true (completions: any logprobs), top_logprobs, non-zero presence /
// frequency penalties, a non-empty logit_bias, best_of other than n, echo true, a non-empty suffix,
// an assistant message's tool_calls. null is the same as leaving an optional field out. Whether the
// model is one the server serves is the caller's check; "model" need only be a string.
//
// Extensions: "denoising_steps", "entropy_bound", response_format {"type": "regex", "regex": ...},
// stream_options.include_drafts (docs/serving.md, "Extensions").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/data/image/Image.h"
#include "runtime/data/rows/Rows.h"
#include "runtime/serve/api/ApiError.h"
#include "runtime/serve/api/Media.h"

namespace dgemma::serve {

enum class Endpoint { ChatCompletions, Completions };

struct ResponseFormat {
  enum Kind { Text, JsonObject, JsonSchema, Regex } kind = Text;
  nlohmann::ordered_json schema;  // json_schema: response_format.json_schema.schema, in the order written
  std::string name;       // json_schema: response_format.json_schema.name
  std::string regex;      // extension: {"type": "regex", "regex": "..."}
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::string model;
  std::vector<Message> messages;  // chat: roles system ("developer" maps to system), user, assistant; image parts
                                  // have kind Image and an empty imagePath
  std::vector<RgbImage> images;   // chat: every image part decoded, in order of appearance
  std::string prompt;             // completions: a string, or an array holding exactly one string
  std::vector<int64_t> promptTokenIds;  // completions: a prompt given as an array of token ids (then prompt is
                                        // empty); ids are >= 0, the vocabulary bound is the caller's check
  std::optional<int64_t> maxTokens;  // max_completion_tokens, else max_tokens (both given and different: 400); >= 1
  double temperature = 1.0;  // [0, 2]
  double topP = 1.0;  // accepted only as 1 (400 otherwise: "not supported by the diffusion sampler")
  std::optional<uint64_t> seed;  // any JSON integer (negative ones wrap to uint64 as two's complement, as vLLM
      // accepts int64)
  std::vector<std::string> stop;  // string or array of up to 4 non-empty strings
  int64_t n = 1;  // [1, 16]
  bool stream = false;
  bool includeUsage = false;  // stream_options.include_usage (stream_options without stream: 400)
  bool includeDrafts = false;  // extension stream_options.include_drafts
  ResponseFormat responseFormat;
  std::optional<int64_t> denoisingSteps;  // extension "denoising_steps": [1, 4096]
  std::optional<double> entropyBound;  // extension "entropy_bound": > 0, finite
};

// Parses a request body of `endpoint`; throws ApiError as described above.
CompletionRequest parseCompletionRequest(std::string_view body, Endpoint endpoint, const MediaPolicy& media);

}  // namespace dgemma::serve
