#include "runtime/serve/service/OpenAiService.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <chrono>
#include <random>

#include "runtime/serve/api/ApiError.h"
#include "runtime/serve/api/Responses.h"
#include "runtime/serve/service/CompletionCall.h"
#include "support/Error.h"

namespace dgemma::serve {

namespace {

constexpr const char* kChatPath = "/v1/chat/completions";
constexpr const char* kCompletionsPath = "/v1/completions";

// Constant-time comparison, so that the key cannot be guessed from response times.
bool sameSecret(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < given.size(); ++i) difference |= static_cast<unsigned char>(given[i] ^ expected[i]);
  return difference == 0;
}

uint64_t randomSeed() {
  static std::mutex mutex;
  static std::mt19937_64 generator{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mutex);
  return generator();
}

}  // namespace

OpenAiService::OpenAiService(BatchEngine& engine, const Tokenizer& tokenizer, ServiceOptions options,
                             ServeMetrics& metrics)
    : engine_(engine),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      metrics_(metrics),
      formats_(tokenizer, engine.settings()),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      preparation_(static_cast<size_t>(std::max<int64_t>(options_.preparationThreads, 1))) {
  if (options_.modelNames.empty()) throw InputError("the server needs at least one model name");
}

OpenAiService::~OpenAiService() { finishPreparing(); }

void OpenAiService::finishPreparing() { preparation_.join(); }

// Hands the request to the preparation pool, or refuses it with 503 when that many wait already.
void OpenAiService::complete(const std::shared_ptr<Exchange>& exchange, Endpoint endpoint) {
  if (preparing_.fetch_add(1) >= options_.maxPreparing) {
    preparing_.fetch_sub(1);
    const std::string retry = std::to_string(static_cast<int64_t>(std::max(1.0, options_.retryAfterSeconds)));
    answerError(exchange, endpoint == Endpoint::ChatCompletions ? "chat_completions" : "completions", 503,
                errorJson(ApiError(503, "service_unavailable_error",
                                   "the server is full: " + std::to_string(options_.maxPreparing) +
                                       " requests are being prepared; retry after " + retry + " s")),
                {{"Retry-After", retry}});
    return;
  }
  boost::asio::post(preparation_, [this, exchange, endpoint] {
    prepareAndSubmit(exchange, endpoint);
    preparing_.fetch_sub(1);
  });
}

void OpenAiService::answerError(const std::shared_ptr<Exchange>& exchange, const std::string& route, int status,
                                const std::string& body, std::vector<std::pair<std::string, std::string>> headers) {
  metrics_.request(route, status);
  exchange->respond({status, "application/json", body, std::move(headers)});
}

void OpenAiService::handle(const std::shared_ptr<Exchange>& exchange) {
  const HttpRequest& request = exchange->request();
  const std::string& path = request.path;
  if (path == "/health") {
    metrics_.request("health", 200);
    exchange->respond({200, "application/json", R"({"status":"ok"})", {}});
    return;
  }
  if (path == "/metrics") {
    metrics_.request("metrics", 200);
    exchange->respond(
        {200,
         "text/plain; version=0.0.4; charset=utf-8",
         metrics_.render(engine_.queued(), engine_.activeSlots(), connectionCount_ ? connectionCount_() : 0),
         {}});
    return;
  }
  const bool known = path == kChatPath || path == kCompletionsPath || path == "/v1/models";
  if (!known) return answerError(exchange, "unknown", 404, errorJson(404, "no route " + path));
  if (!options_.apiKey.empty() && !sameSecret(request.header("authorization"), "Bearer " + options_.apiKey))
    return answerError(
        exchange, path, 401,
        errorJson(ApiError(401, "authentication_error", "Incorrect API key provided.", "", "invalid_api_key")));
  if (path == "/v1/models") {
    if (request.method != "GET") return answerError(exchange, "models", 405, errorJson(405, "use GET " + path));
    metrics_.request("models", 200);
    exchange->respond({200, "application/json", modelsJson(options_.modelNames, created_), {}});
    return;
  }
  if (request.method != "POST") return answerError(exchange, path, 405, errorJson(405, "use POST " + path));
  complete(exchange, path == kChatPath ? Endpoint::ChatCompletions : Endpoint::Completions);
}

void OpenAiService::prepareAndSubmit(const std::shared_ptr<Exchange>& exchange, Endpoint endpoint) {
  const std::string route = endpoint == Endpoint::ChatCompletions ? "chat_completions" : "completions";
  std::shared_ptr<CompletionCall> call;
  try {
    CompletionRequest request = parseCompletionRequest(exchange->request().body, endpoint, options_.media);
    if (std::find(options_.modelNames.begin(), options_.modelNames.end(), request.model) == options_.modelNames.end())
      throw ApiError(
          404, "not_found_error",
          "The model `" + request.model + "` does not exist; this server serves `" + options_.modelNames.front() + "`.",
          "model", "model_not_found");

    std::vector<int64_t> promptIds, tokenTypes;
    std::vector<ProcessedImage> images;
    if (endpoint == Endpoint::ChatCompletions) {
      if (!request.images.empty() && engine_.imagesPerExample() == 0)
        throw badRequest(
            "messages: the request has images, but the served plan is text-only (dgemma-serve "
            "--images-per-example)",
            "messages");
      std::vector<int64_t> softTokens;
      for (const RgbImage& image : request.images) {
        images.push_back(processGemma4Image(image, engine_.imageOptions()));
        softTokens.push_back(images.back().numSoftTokens);
      }
      const TokenizedPrompt prompt = renderGemma4Prompt(tokenizer_, request.messages, softTokens);
      promptIds.assign(prompt.inputIds.begin(), prompt.inputIds.end());
      if (!images.empty()) tokenTypes.assign(prompt.mmTokenTypeIds.begin(), prompt.mmTokenTypeIds.end());
    } else if (!request.promptTokenIds.empty()) {
      promptIds = request.promptTokenIds;
    } else {
      promptIds.push_back(tokenizer_.bosId());
      for (int32_t id : tokenizer_.encode(request.prompt)) promptIds.push_back(id);
    }

    const int64_t maxTokens = request.maxTokens.value_or(engine_.maxNewTokens());
    if (maxTokens > engine_.maxNewTokens())
      throw badRequest("max_tokens: " + std::to_string(maxTokens) + " is above the server's " +
                           std::to_string(engine_.maxNewTokens()) + " (dgemma-serve --max-new-tokens)",
                       "max_tokens");
    ConstraintMaker constraint = formats_.makerFor(request.responseFormat, maxTokens);

    CallSettings settings;
    settings.endpoint = endpoint;
    settings.choices = request.n;
    settings.stream = request.stream;
    settings.includeUsage = request.includeUsage;
    settings.includeDrafts = request.includeDrafts;
    settings.stop = request.stop;
    settings.promptTokens = static_cast<int64_t>(promptIds.size());
    call = std::make_shared<CompletionCall>(exchange, tokenizer_, newResponseIdentity(endpoint, request.model),
                                            settings, metrics_);
    const uint64_t seed = request.seed ? *request.seed : randomSeed();
    for (int64_t choice = 0; choice < request.n; ++choice) {
      GenerationJob job;
      job.promptIds = promptIds;
      job.promptTokenTypes = tokenTypes;
      job.images = images;
      job.sampling.seed = seed;
      job.sampling.drawRequest = choice;
      job.sampling.maxTokens = maxTokens;
      job.sampling.temperature = request.temperature;
      job.sampling.denoisingSteps = request.denoisingSteps.value_or(0);
      job.sampling.entropyBound = request.entropyBound.value_or(0);
      job.sampling.drafts = request.includeDrafts;
      if (constraint) job.constraint = constraint();
      job.sink = call->sinkFor(choice);
      call->setHandle(choice, engine_.submit(std::move(job)));
    }
    call->start();
  } catch (const ApiError& error) {
    if (call) call->cancelAll();
    answerError(exchange, route, error.status, errorJson(error));
  } catch (const EngineFull& full) {
    if (call) call->cancelAll();
    const std::string retry = std::to_string(static_cast<int64_t>(std::max(1.0, options_.retryAfterSeconds)));
    answerError(
        exchange, route, 503,
        errorJson(ApiError(503, "service_unavailable_error",
                           std::string("the server is full: ") + full.what() + "; retry after " + retry + " s")),
        {{"Retry-After", retry}});
  } catch (const InputError& error) {
    if (call) call->cancelAll();
    answerError(exchange, route, 400, errorJson(badRequest(error.what())));
  } catch (const std::exception& error) {
    // Off the io thread nothing else would catch it: a bug answers 500, the server goes on.
    if (call) call->cancelAll();
    answerError(exchange, route, 500, errorJson(ApiError(500, "server_error", error.what())));
  }
}

}  // namespace dgemma::serve
