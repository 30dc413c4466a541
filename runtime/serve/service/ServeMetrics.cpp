#include "runtime/serve/service/ServeMetrics.h"

#include <vector>

namespace dgemma::serve {

namespace {

const std::vector<double> kSecondsBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1,      2.5,   5,    10,    25,   50,  100};
const std::vector<double> kOccupancyBuckets = {0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1};

}  // namespace

// Registered up front so that every family shows from the first scrape, in this order.
ServeMetrics::ServeMetrics(int64_t slots)
    : slots_(slots),
      queueDepth_(registry_.gauge("dgemma_queue_depth", "Requests waiting for a slot.")),
      slotCount_(registry_.gauge("dgemma_slots", "Slots of the plan: requests generated at once.")),
      activeSlots_(registry_.gauge("dgemma_active_slots", "Slots holding a request.")),
      openConnections_(registry_.gauge("dgemma_open_connections", "Open HTTP connections.")),
      promptTokens_(registry_.counter("dgemma_prompt_tokens", "Prompt tokens of answered requests.")),
      completionTokens_(registry_.counter("dgemma_completion_tokens", "Completion tokens generated.")),
      occupancy_(registry_.histogram("dgemma_batch_occupancy", "Share of the slots a denoise step worked for.",
                                     kOccupancyBuckets)),
      firstChunk_(registry_.histogram("dgemma_time_to_first_chunk_seconds",
                                      "From a request's arrival to its first output.", kSecondsBuckets)),
      requestSeconds_(
          registry_.histogram("dgemma_request_seconds", "From a request's arrival to its end.", kSecondsBuckets)) {
  slotCount_.set(static_cast<double>(slots));
}

void ServeMetrics::request(const std::string& endpoint, int status) {
  registry_
      .counter("dgemma_requests", "Requests answered, by endpoint and status.",
               {{"endpoint", endpoint}, {"status", std::to_string(status)}})
      .inc();
}

void ServeMetrics::tokens(int64_t prompt, int64_t completion) {
  promptTokens_.inc(static_cast<double>(prompt));
  completionTokens_.inc(static_cast<double>(completion));
}

void ServeMetrics::firstChunk(double seconds) { firstChunk_.observe(seconds); }

void ServeMetrics::finished(double seconds) { requestSeconds_.observe(seconds); }

void ServeMetrics::step(const EngineStepRecord& record) {
  registry_
      .histogram("dgemma_step_seconds", "Entry runs of engine steps, by entry point.", kSecondsBuckets,
                 {{"entry", record.entry}})
      .observe(record.seconds);
  if (record.denoising) occupancy_.observe(static_cast<double>(record.rows) / static_cast<double>(slots_));
}

std::string ServeMetrics::render(int64_t queued, int64_t activeSlots, size_t openConnections) {
  queueDepth_.set(static_cast<double>(queued));
  activeSlots_.set(static_cast<double>(activeSlots));
  openConnections_.set(static_cast<double>(openConnections));
  return registry_.render();
}

}  // namespace dgemma::serve
