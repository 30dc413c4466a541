#include "runtime/serve/service/CompletionCall.h"

#include "runtime/serve/api/ApiError.h"

namespace dgemma::serve {

namespace {

const char* endpointName(Endpoint endpoint) {
  return endpoint == Endpoint::ChatCompletions ? "chat_completions" : "completions";
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

class CompletionCall::ChoiceSink : public JobSink {
 public:
  ChoiceSink(std::shared_ptr<CompletionCall> call, int64_t index) : call_(std::move(call)), index_(index) {}
  void onDraft(int64_t canvas, int64_t step, std::span<const int64_t> ids) override {
    call_->onDraft(index_, canvas, step, ids);
  }
  void onCanvas(int64_t canvas, std::span<const int64_t> tokens) override {
    (void)canvas;
    call_->onCanvas(index_, tokens);
  }
  void onEnd(const JobSummary& summary) override { call_->onEnd(index_, summary); }

 private:
  std::shared_ptr<CompletionCall> call_;
  int64_t index_;
};

CompletionCall::CompletionCall(std::shared_ptr<Exchange> exchange, const Tokenizer& tokenizer,
                               ResponseIdentity identity, CallSettings settings, ServeMetrics& metrics)
    : exchange_(std::move(exchange)),
      tokenizer_(tokenizer),
      identity_(std::move(identity)),
      settings_(std::move(settings)),
      metrics_(metrics),
      started_(std::chrono::steady_clock::now()) {
  choices_.resize(settings_.choices);
  finishReasons_.resize(settings_.choices);
  for (Choice& choice : choices_) {
    choice.text = std::make_unique<IncrementalText>(tokenizer_);
    choice.stop = std::make_unique<StopMatcher>(settings_.stop);
  }
}

std::shared_ptr<JobSink> CompletionCall::sinkFor(int64_t index) {
  return std::make_shared<ChoiceSink>(shared_from_this(), index);
}

void CompletionCall::setHandle(int64_t index, std::shared_ptr<JobHandle> handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  choices_[index].handle = std::move(handle);
}

void CompletionCall::cancelAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Choice& choice : choices_)
    if (choice.handle) choice.handle->cancel();
}

void CompletionCall::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  // The engine may have reported before the call was whole (its jobs run as soon as submitted):
  // what it said waits here until the stream starts.
  if (settings_.stream) {
    exchange_->startStream(200, "text/event-stream");
    for (std::string& chunk : pending_) exchange_->writeChunk(std::move(chunk));
    pending_.clear();
    if (closed_) exchange_->endStream();
  }
  live_ = true;
  // The exchange holds the call only weakly: a call that has answered is not kept alive by it.
  std::weak_ptr<CompletionCall> self = shared_from_this();
  exchange_->onClientGone([self] {
    if (std::shared_ptr<CompletionCall> call = self.lock()) call->cancelAll();
  });
}

void CompletionCall::send(std::string chunk) {
  if (live_) {
    exchange_->writeChunk(std::move(chunk));
  } else {
    pending_.push_back(std::move(chunk));
  }
}

void CompletionCall::closeStream() {
  if (live_) {
    exchange_->endStream();
  } else {
    closed_ = true;
  }
}

void CompletionCall::firstOutput() {
  if (sentFirst_) return;
  sentFirst_ = true;
  metrics_.firstChunk(secondsSince(started_));
}

void CompletionCall::emit(Choice& choice, int64_t index, const std::string& text,
                          const std::optional<std::string>& finish) {
  if (!settings_.stream) {
    choice.output += text;
    return;
  }
  if (text.empty() && !finish) return;
  const bool withRole = settings_.endpoint == Endpoint::ChatCompletions && !choice.sentRole;
  choice.sentRole = true;
  firstOutput();
  send(sseEvent(chunkJson(identity_, settings_.endpoint, index, withRole, text, finish)));
}

void CompletionCall::onDraft(int64_t index, int64_t canvas, int64_t step, std::span<const int64_t> ids) {
  if (!settings_.stream || !settings_.includeDrafts) return;
  const std::string text = tokenizer_.decode(ids);
  std::lock_guard<std::mutex> lock(mutex_);
  if (choices_[index].stoppedByString) return;
  firstOutput();
  send(sseEvent(draftChunkJson(identity_, settings_.endpoint, index, canvas, step, text)));
}

void CompletionCall::onCanvas(int64_t index, std::span<const int64_t> tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  Choice& choice = choices_[index];
  if (choice.stoppedByString) return;
  const std::string text = choice.stop->push(choice.text->push(tokens));
  emit(choice, index, text, std::nullopt);
  if (choice.stop->stopped()) {
    choice.stoppedByString = true;
    if (choice.handle) choice.handle->cancel();
  }
}

void CompletionCall::onEnd(int64_t index, const JobSummary& summary) {
  std::lock_guard<std::mutex> lock(mutex_);
  Choice& choice = choices_[index];
  choice.ended = true;
  choice.completionTokens = summary.completionTokens;
  if (summary.end == JobEnd::Failed) {
    failed_ = true;
    error_ = summary.error;
  }
  if (summary.end == JobEnd::Cancelled && !choice.stoppedByString) {
    // The client went away (or the call could not be submitted whole): nothing more to send.
    if (++ended_ == settings_.choices && settings_.stream) closeStream();
    return;
  }
  std::string finish = summary.end == JobEnd::Length ? "length" : "stop";
  if (!choice.stoppedByString) {
    std::string tail = choice.text->flush();
    tail = choice.stop->push(tail);
    if (!choice.stop->stopped()) tail += choice.stop->flush();
    emit(choice, index, tail, std::nullopt);
    if (choice.stop->stopped()) finish = "stop";
  }
  finishReasons_[index] = finish;
  if (settings_.stream && !failed_) emit(choice, index, "", finish);
  if (++ended_ < settings_.choices) return;

  Usage usage{settings_.promptTokens, 0};
  for (const Choice& each : choices_) usage.completionTokens += each.completionTokens;
  metrics_.tokens(usage.promptTokens, usage.completionTokens);
  metrics_.finished(secondsSince(started_));
  if (failed_) {
    const ApiError error(500, "internal_error", "generation failed: " + error_);
    metrics_.request(endpointName(settings_.endpoint), 500);
    if (settings_.stream) {
      send(sseEvent(errorJson(error)));
      closeStream();
    } else {
      exchange_->respond({500, "application/json", errorJson(error), {}});
    }
    return;
  }
  metrics_.request(endpointName(settings_.endpoint), 200);
  if (settings_.stream) {
    if (settings_.includeUsage) send(sseEvent(usageChunkJson(identity_, settings_.endpoint, usage)));
    send(sseDone());
    closeStream();
    return;
  }
  std::vector<ChoiceResult> results;
  for (int64_t i = 0; i < settings_.choices; ++i) results.push_back({i, choices_[i].output, finishReasons_[i]});
  firstOutput();
  exchange_->respond({200, "application/json", completionJson(identity_, settings_.endpoint, results, usage), {}});
}

}  // namespace dgemma::serve
