// The routes of dgemma-serve (docs/serving.md): the OpenAI API over the batch engine, with health,
// metrics and the optional Bearer key. handle() runs on the HTTP server's io thread; a completion
// request is prepared (parsed, its images decoded, its prompt templated and tokenized, its response
// format compiled) on a small pool of its own, so that this work never holds up other connections;
// the engine answers from its own thread through each call's Exchange.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/serve/api/Request.h"
#include "runtime/serve/engine/BatchEngine.h"
#include "runtime/serve/http/HttpServer.h"
#include "runtime/serve/service/ResponseFormats.h"
#include "runtime/serve/service/ServeMetrics.h"

namespace dgemma::serve {

struct ServiceOptions {
  std::vector<std::string> modelNames;  // what /v1/models lists and "model" must name
  std::string apiKey;                   // empty: no authentication
  MediaPolicy media;
  double retryAfterSeconds = 1;         // the Retry-After of a 503 when the queue is full
  int64_t preparationThreads = 2;       // threads that prepare completion requests
  int64_t maxPreparing = 64;            // requests being prepared or waiting for it; beyond, 503
};

class OpenAiService {
 public:
  OpenAiService(BatchEngine& engine, const Tokenizer& tokenizer, ServiceOptions options, ServeMetrics& metrics);
  ~OpenAiService();

  // The HTTP server's handler.
  void handle(const std::shared_ptr<Exchange>& exchange);
  // Set by the tool once the server exists: the connection count for /metrics.
  void setConnectionCount(std::function<size_t()> count) { connectionCount_ = std::move(count); }
  // Waits until every request handed to the preparation pool is prepared: after the HTTP server has
  // stopped and before it is destroyed.
  void finishPreparing();

 private:
  void complete(const std::shared_ptr<Exchange>& exchange, Endpoint endpoint);
  void prepareAndSubmit(const std::shared_ptr<Exchange>& exchange, Endpoint endpoint);
  void answerError(const std::shared_ptr<Exchange>& exchange, const std::string& route, int status,
                   const std::string& body, std::vector<std::pair<std::string, std::string>> headers = {});

  BatchEngine& engine_;
  const Tokenizer& tokenizer_;
  ServiceOptions options_;
  ServeMetrics& metrics_;
  ResponseFormats formats_;
  std::function<size_t()> connectionCount_;
  int64_t created_;
  std::atomic<int64_t> preparing_{0};
  boost::asio::thread_pool preparation_;
};

}  // namespace dgemma::serve
