// response_format to the structured-output rule of a request's choices (docs/serving.md,
// "Structured output"): json_object, json_schema and the regex extension compile to a token
// constraint over the served tokenizer, kept in a small cache (clients repeat their schemas), and
// every choice gets its own state over it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "plan/Plan.h"
#include "runtime/data/text/Tokenizer.h"
#include "runtime/serve/api/Request.h"
#include "runtime/serve/constrain/TokenConstraint.h"
#include "runtime/serve/engine/GenerationJob.h"

namespace dgemma::serve {

// Makes one choice's constraint; empty for an unconstrained request.
using ConstraintMaker = std::function<std::unique_ptr<CanvasConstraint>()>;

class ResponseFormats {
 public:
  ResponseFormats(const Tokenizer& tokenizer, const GenerationSettings& settings, size_t cacheEntries = 32);

  // The maker for `format` with a budget of `maxTokens` tokens. Throws ApiError 400 naming
  // response_format for a schema or regex outside the supported subset, or one whose shortest
  // valid text needs more than `maxTokens` tokens.
  ConstraintMaker makerFor(const ResponseFormat& format, int64_t maxTokens);

 private:
  std::shared_ptr<const TokenConstraint> compile(const ResponseFormat& format);

  TokenVocabulary vocabulary_;
  size_t cacheEntries_;
  std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<const TokenConstraint>>> cache_;  // most recent first
};

}  // namespace dgemma::serve
