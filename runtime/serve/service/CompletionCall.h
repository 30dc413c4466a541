// One API call in flight (docs/serving.md, "Requests"): its n choices, each a generation job on the
// engine, turned into the response, or into the SSE stream as canvases commit. The sinks run on the
// engine thread and hand their output to the Exchange, which writes it on the io thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/serve/api/Request.h"
#include "runtime/serve/api/Responses.h"
#include "runtime/serve/api/StreamText.h"
#include "runtime/serve/engine/BatchEngine.h"
#include "runtime/serve/http/HttpServer.h"
#include "runtime/serve/service/ServeMetrics.h"

namespace dgemma::serve {

struct CallSettings {
  Endpoint endpoint = Endpoint::ChatCompletions;
  int64_t choices = 1;
  bool stream = false;
  bool includeUsage = false;
  bool includeDrafts = false;
  std::vector<std::string> stop;
  int64_t promptTokens = 0;
};

class CompletionCall : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(std::shared_ptr<Exchange> exchange, const Tokenizer& tokenizer, ResponseIdentity identity,
                 CallSettings settings, ServeMetrics& metrics);

  // The sink of choice `index`'s job.
  std::shared_ptr<JobSink> sinkFor(int64_t index);
  // The handle of choice `index`'s job, once submitted: cancelled when a stop string ends the choice
  // or the client goes away.
  void setHandle(int64_t index, std::shared_ptr<JobHandle> handle);
  // Once every job is submitted: starts the SSE response (stream calls) with what the jobs reported
  // so far, and cancels every job when the client goes away.
  void start();
  // Cancels every submitted job (the call could not be submitted whole).
  void cancelAll();

 private:
  class ChoiceSink;
  struct Choice {
    std::unique_ptr<IncrementalText> text;
    std::unique_ptr<StopMatcher> stop;
    std::shared_ptr<JobHandle> handle;
    std::string output;  // non-streamed calls: the text so far
    bool sentRole = false;
    bool stoppedByString = false;
    bool ended = false;
    int64_t completionTokens = 0;
  };

  void onDraft(int64_t index, int64_t canvas, int64_t step, std::span<const int64_t> ids);
  void onCanvas(int64_t index, std::span<const int64_t> tokens);
  void onEnd(int64_t index, const JobSummary& summary);
  // Emits `text` of choice `index` (a chunk when streaming); empty text sends nothing.
  void emit(Choice& choice, int64_t index, const std::string& text, const std::optional<std::string>& finish);
  void firstOutput();
  // A stream's chunk, or its end: written once start() has run, held until then (mutex held).
  void send(std::string chunk);
  void closeStream();

  std::shared_ptr<Exchange> exchange_;
  const Tokenizer& tokenizer_;
  ResponseIdentity identity_;
  CallSettings settings_;
  ServeMetrics& metrics_;
  std::chrono::steady_clock::time_point started_;
  std::mutex mutex_;
  std::vector<Choice> choices_;
  std::vector<std::string> finishReasons_;
  int64_t ended_ = 0;
  bool failed_ = false;
  bool sentFirst_ = false;
  bool live_ = false;    // start() has run
  bool closed_ = false;  // the stream ended before start()
  std::vector<std::string> pending_;
  std::string error_;
};

}  // namespace dgemma::serve
