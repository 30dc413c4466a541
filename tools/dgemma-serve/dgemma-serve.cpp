// dgemma-serve: an OpenAI-compatible HTTP server over block-diffusion generation with continuous
// batching (docs/serving.md). It compiles (and caches) the inference plan its flags ask for, loads
// the weights, and serves until SIGTERM or SIGINT, which drain it: no new request is taken, the ones
// in flight finish (up to --drain-seconds), then it exits 0.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "runtime/model/ModelAdapter.h"
#include "runtime/serve/api/ApiError.h"
#include "runtime/serve/engine/BatchEngine.h"
#include "runtime/serve/http/HttpServer.h"
#include "runtime/serve/service/OpenAiService.h"
#include "runtime/serve/service/ServeMetrics.h"
#include "runtime/session/Session.h"
#include "support/Error.h"
#include "tools/common/CliSupport.h"
#include "tools/common/FlagRanges.h"
#include "tools/dgemma-serve/PlanCache.h"

namespace {

namespace fs = std::filesystem;
using dgemma::InputError;

struct ServeFlags {
  std::string model, weights, tokenizer, adapter;
  std::string backend = "cpu";
  int64_t device = 0, threads = 0;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> servedModelNames;
  std::string apiKey;
  std::string allowedLocalMediaPath;
  int64_t maxNumSeqs = 8;
  std::string promptLengths = "64,256";
  int64_t maxNewTokens = 0;
  int64_t imagesPerExample = -1;
  std::string precision = "fp32";
  int64_t maxQueued = -1;
  int64_t maxBodyMiB = 32;
  std::string planCache;
  double drainSeconds = 30;
  double idleTimeoutSeconds = 30;
};

// The model directory's config.json (the directory itself when --model names the file).
nlohmann::json readConfig(const std::string& model) {
  const fs::path path = fs::is_directory(model) ? fs::path(model) / "config.json" : fs::path(model);
  std::ifstream in(path);
  if (!in) throw InputError("--model " + model + ": no config.json there");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw InputError(path.string() + ": invalid JSON: " + error.what());
  }
}

// The compile options of the served plan; an adapter's rank, alpha and targets from its directory.
dgemma::CompileOptions compileOptions(const ServeFlags& flags, const nlohmann::json& config) {
  dgemma::CompileOptions options;
  options.model = flags.model;
  options.mode = "infer";
  options.microBatch = flags.maxNumSeqs;
  options.promptLengths = flags.promptLengths;
  if (flags.maxNewTokens > 0) options.maxNewTokens = flags.maxNewTokens;
  options.imagesPerExample =
      flags.imagesPerExample >= 0 ? flags.imagesPerExample : (config.contains("vision_config") ? 1 : 0);
  options.precision = flags.precision;
  options.backend = flags.backend;
  if (!flags.adapter.empty()) {
    const dgemma::AdapterSettings adapter =
        dgemma::modelAdapterFor(dgemma::ModelFamily::DiffusionGemma).adapterSettings(flags.adapter);
    options.lora = std::to_string(adapter.rank) + ":" + std::to_string(adapter.alpha);
    options.loraTargets.clear();
    for (const std::string& target : adapter.targets)
      options.loraTargets += (options.loraTargets.empty() ? "" : ",") + target;
  }
  return options;
}

int serve(const ServeFlags& flags) {
  const nlohmann::json config = readConfig(flags.model);
  const std::string cacheDir = flags.planCache.empty() ? dgemma::tool::defaultPlanCacheDir() : flags.planCache;
  std::cerr << "dgemma-serve: compiling the inference plan (or reusing it from " << cacheDir << ")\n";
  const std::string plan = dgemma::tool::cachedPlan(compileOptions(flags, config), cacheDir);

  dgemma::SessionOptions sessionOptions;
  sessionOptions.planDir = plan;
  sessionOptions.weights = flags.weights.empty() ? flags.model : flags.weights;
  sessionOptions.adapter = flags.adapter;
  sessionOptions.backend = flags.backend;
  sessionOptions.device = flags.device;
  sessionOptions.threads = flags.threads;
  std::unique_ptr<dgemma::Session> session = dgemma::openSession(sessionOptions);
  const dgemma::Tokenizer tokenizer(flags.tokenizer.empty() ? sessionOptions.weights : flags.tokenizer);

  dgemma::serve::ServeMetrics metrics(flags.maxNumSeqs);
  dgemma::serve::EngineOptions engineOptions;
  engineOptions.maxQueued = flags.maxQueued >= 0 ? flags.maxQueued : 4 * flags.maxNumSeqs;
  engineOptions.onStep = [&metrics](const dgemma::serve::EngineStepRecord& record) { metrics.step(record); };
  dgemma::serve::BatchEngine engine(*session, engineOptions);
  tokenizer.checkVocabSize(engine.vocabSize());

  dgemma::serve::ServiceOptions serviceOptions;
  serviceOptions.modelNames =
      flags.servedModelNames.empty() ? std::vector<std::string>{flags.model} : flags.servedModelNames;
  serviceOptions.apiKey = flags.apiKey;
  serviceOptions.media.allowedLocalMediaPath = flags.allowedLocalMediaPath;
  serviceOptions.media.maxImageBytes = static_cast<size_t>(flags.maxBodyMiB) << 20;
  dgemma::serve::OpenAiService service(engine, tokenizer, serviceOptions, metrics);

  dgemma::serve::HttpServerOptions httpOptions;
  httpOptions.host = flags.host;
  httpOptions.port = flags.port;
  httpOptions.maxBodyBytes = static_cast<size_t>(flags.maxBodyMiB) << 20;
  httpOptions.idleTimeoutSeconds = flags.idleTimeoutSeconds;
  httpOptions.errorBody = [](int status, const std::string& message) {
    return dgemma::serve::errorJson(status, message);
  };
  dgemma::serve::HttpServer server(
      httpOptions, [&service](std::shared_ptr<dgemma::serve::Exchange> exchange) { service.handle(exchange); });
  service.setConnectionCount([&server] { return server.openConnections(); });
  server.drainOnSignals(flags.drainSeconds);

  std::thread engineThread([&engine] { engine.run(); });
  std::cerr << "dgemma-serve: " << engine.slots() << " slots, prompts up to " << engine.maxPromptLength()
            << " tokens, max_new_tokens " << engine.maxNewTokens() << ", canvas " << engine.canvasLength()
            << (engine.imagesPerExample() > 0 ? ", images" : ", text only") << "; model name \""
            << serviceOptions.modelNames.front() << "\"\n";
  std::cerr << "dgemma-serve: listening on http://" << flags.host << ":" << server.boundPort() << std::endl;
  server.run();
  service.finishPreparing();
  engine.stop();
  engineThread.join();
  std::cerr << "dgemma-serve: drained, exiting\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ServeFlags flags;
  CLI::App app{"dgemma-serve: an OpenAI-compatible server with continuous block-diffusion batching (docs/serving.md)",
               "dgemma-serve"};
  app.add_option("--model", flags.model, "HF model directory (config.json and weights) or a dgemma checkpoint")
      ->required();
  app.add_option("--weights", flags.weights, "the weights, when not in --model's directory");
  app.add_option("--tokenizer", flags.tokenizer, "tokenizer directory (default: the weights' directory)");
  app.add_option("--adapter", flags.adapter, "a PEFT LoRA adapter directory to serve over the base");
  app.add_option("--backend", flags.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--device", flags.device, "--backend cuda: the GPU index")->check(dgemma::integerIn(0, 1024));
  app.add_option("--threads", flags.threads, "CPU worker threads (0: one per core)")->check(dgemma::integerIn(0, 4096));
  app.add_option("--host", flags.host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", flags.port, "port to listen on (0: any free port; default 8000)")
      ->check(dgemma::integerIn(0, 65535));
  app.add_option("--served-model-name", flags.servedModelNames,
                 "the model name clients send (default: --model as given); repeatable");
  app.add_option("--api-key", flags.apiKey, "require Authorization: Bearer KEY on /v1/ routes");
  app.add_option("--allowed-local-media-path", flags.allowedLocalMediaPath,
                 "image URLs may name local files inside this directory (default: none may)");
  app.add_option("--max-num-seqs", flags.maxNumSeqs,
                 "slots: requests (choices) generated at once; the plan's micro-batch")
      ->check(dgemma::integerIn(1, 4096));
  app.add_option("--prompt-len", flags.promptLengths,
                 "prompt buckets, comma-separated (the largest is the longest prompt)");
  app.add_option("--max-new-tokens", flags.maxNewTokens,
                 "the most completion tokens a request may ask (default: the model's)")
      ->check(dgemma::integerIn(1, dgemma::kMaxLength));
  app.add_option("--images-per-example", flags.imagesPerExample,
                 "images a prompt may carry (default: 1 for a model with a vision tower, else 0)")
      ->check(dgemma::integerIn(0, dgemma::kMaxImagesPerExample));
  app.add_option("--precision", flags.precision, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--max-queued", flags.maxQueued,
                 "requests waiting for a slot before 503 (default: 4 x --max-num-seqs)")
      ->check(dgemma::integerIn(0, 1 << 20));
  app.add_option("--max-body-mib", flags.maxBodyMiB, "largest request body in MiB (larger: 413; default 32)")
      ->check(dgemma::integerIn(1, 4096));
  app.add_option("--plan-cache", flags.planCache, "where compiled plans are kept (default: ~/.cache/dgemma/plans)");
  app.add_option("--drain-seconds", flags.drainSeconds, "on SIGTERM, how long requests in flight may take (default 30)")
      ->check(dgemma::numberIn(0, 86400));
  app.add_option("--idle-timeout", flags.idleTimeoutSeconds,
                 "seconds before an idle keep-alive connection closes (default 30)")
      ->check(dgemma::numberIn(0, 86400, false));
  int exitCode = 0;
  if (!dgemma::parseCommandLine(app, argc, argv, exitCode)) return exitCode;
  return dgemma::runReportingErrors("dgemma-serve", [&] { return serve(flags); });
}
