// The series of GET /metrics (docs/serving.md, "Metrics"): requests by endpoint and status, prompt
// and completion tokens, queue depth, slot occupancy, step times by entry point, time to the first
// chunk and end-to-end latency.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/serve/api/Metrics.h"
#include "runtime/serve/engine/BatchEngine.h"

namespace dgemma::serve {

class ServeMetrics {
 public:
  explicit ServeMetrics(int64_t slots);

  void request(const std::string &endpoint, int status);
  void tokens(int64_t prompt, int64_t completion);
  void firstChunk(double seconds);
  void finished(double seconds);
  // An engine step's entry run (EngineOptions::onStep): its time, and for a decoder pass the share
  // of slots it worked for.
  void step(const EngineStepRecord &record);
  // The text exposition, with the gauges read now.
  std::string render(int64_t queued, int64_t activeSlots, size_t openConnections);

 private:
  MetricsRegistry registry_;
  int64_t slots_;
  Gauge &queueDepth_, &slotCount_, &activeSlots_, &openConnections_;
  Counter &promptTokens_, &completionTokens_;
  Histogram &occupancy_, &firstChunk_, &requestSeconds_;
};

}  // namespace dgemma::serve
