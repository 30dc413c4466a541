#include "runtime/serve/service/ResponseFormats.h"

#include "runtime/serve/api/ApiError.h"
#include "runtime/serve/constrain/ConstraintState.h"
#include "runtime/serve/constrain/JsonSchema.h"
#include "runtime/serve/constrain/Regex.h"
#include "support/Error.h"

namespace dgemma::serve {

namespace {

// A choice's ConstraintState as the engine's CanvasConstraint. The sampler freezes nothing between
// passes (every position is predicted again and an accepted one takes the new sample,
// docs/generation.md), so each pass's acceptance is filtered afresh: the positions this pass
// accepted, fixed together, must leave the canvas completable.
class ChoiceConstraint : public CanvasConstraint {
 public:
  ChoiceConstraint(std::shared_ptr<const TokenConstraint> constraint, int64_t budget)
      : state_(std::move(constraint), budget) {}
  void beginCanvas(int64_t length) override {
    length_ = length;
    state_.beginCanvas(length);
  }
  std::vector<int64_t> filterAccepted(std::span<const int64_t> tokens, std::span<const int64_t> candidates) override {
    state_.beginCanvas(length_);
    return state_.filterAccepted(tokens, candidates);
  }
  bool commitCanvas(std::span<int64_t> tokens, std::span<const int64_t> alternative) override {
    return state_.commitCanvas(tokens, alternative);
  }

 private:
  ConstraintState state_;
  int64_t length_ = 0;
};

std::string cacheKey(const ResponseFormat& format) {
  switch (format.kind) {
    case ResponseFormat::JsonObject: return "json_object";
    case ResponseFormat::JsonSchema: return "json_schema:" + format.schema.dump();
    case ResponseFormat::Regex: return "regex:" + format.regex;
    case ResponseFormat::Text: break;
  }
  return "";
}

}  // namespace

ResponseFormats::ResponseFormats(const Tokenizer& tokenizer, const GenerationSettings& settings, size_t cacheEntries)
    : cacheEntries_(cacheEntries) {
  vocabulary_.tokenBytes = tokenizer.tokenBytes();
  for (int64_t id = 0; id < static_cast<int64_t>(vocabulary_.tokenBytes.size()); ++id)
    if (tokenizer.isSpecial(static_cast<int32_t>(id))) vocabulary_.forbiddenIds.push_back(static_cast<int32_t>(id));
  for (int64_t id : settings.eosTokenIds) vocabulary_.eosIds.push_back(static_cast<int32_t>(id));
  vocabulary_.padId = static_cast<int32_t>(settings.padTokenId);
}

std::shared_ptr<const TokenConstraint> ResponseFormats::compile(const ResponseFormat& format) {
  const std::string key = cacheKey(format);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it)
      if (it->first == key) {
        cache_.splice(cache_.begin(), cache_, it);
        return cache_.front().second;
      }
  }
  std::shared_ptr<const ByteAutomaton> automaton;
  try {
    if (format.kind == ResponseFormat::JsonObject) automaton = compileJsonObject("response_format");
    if (format.kind == ResponseFormat::JsonSchema)
      automaton = compileJsonSchema(format.schema, "response_format.json_schema.schema");
    if (format.kind == ResponseFormat::Regex) automaton = compileRegex(format.regex, "response_format.regex");
  } catch (const InputError& error) {
    throw badRequest(error.what(), "response_format");
  }
  auto constraint = std::make_shared<const TokenConstraint>(std::move(automaton), vocabulary_);
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.emplace_front(key, constraint);
  if (cache_.size() > cacheEntries_) cache_.pop_back();
  return constraint;
}

ConstraintMaker ResponseFormats::makerFor(const ResponseFormat& format, int64_t maxTokens) {
  if (format.kind == ResponseFormat::Text) return {};
  std::shared_ptr<const TokenConstraint> constraint = compile(format);
  const int64_t needed = constraint->minimumTokens();
  if (needed == TokenConstraint::kUnreachable)
    throw badRequest("response_format: no text the tokenizer can write satisfies it", "response_format");
  if (needed > maxTokens)
    throw badRequest("response_format: its shortest valid text takes " + std::to_string(needed) +
                         " tokens, more than max_tokens " + std::to_string(maxTokens),
                     "response_format");
  return [constraint, maxTokens] { return std::make_unique<ChoiceConstraint>(constraint, maxTokens); };
}

}  // namespace dgemma::serve
