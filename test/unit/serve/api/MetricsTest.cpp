// The metrics registry's Prometheus text exposition format 0.0.4 (docs/serving.md, "Metrics").
#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/serve/api/Metrics.h"

namespace dgemma::serve {
namespace {

TEST(ServeMetrics, RendersCountersGaugesAndHistograms) {
  MetricsRegistry registry;
  registry.counter("dgemma_requests", "Requests received.", {{"endpoint", "chat"}}).inc();
  registry.counter("dgemma_requests", "Requests received.", {{"endpoint", "chat"}}).inc(2);
  registry.counter("dgemma_requests_total", "Requests received.", {{"endpoint", "completions"}}).inc();
  registry.gauge("dgemma_running", "Requests being generated.").set(3);
  registry.gauge("dgemma_running", "Requests being generated.").dec();
  Histogram& latency = registry.histogram("dgemma_latency_seconds", "Request latency.", {0.5, 1, 2.5});
  latency.observe(0.25);
  latency.observe(1);
  latency.observe(7);
  EXPECT_EQ(registry.render(),
            "# HELP dgemma_requests_total Requests received.\n"
            "# TYPE dgemma_requests_total counter\n"
            "dgemma_requests_total{endpoint=\"chat\"} 3\n"
            "dgemma_requests_total{endpoint=\"completions\"} 1\n"
            "# HELP dgemma_running Requests being generated.\n"
            "# TYPE dgemma_running gauge\n"
            "dgemma_running 2\n"
            "# HELP dgemma_latency_seconds Request latency.\n"
            "# TYPE dgemma_latency_seconds histogram\n"
            "dgemma_latency_seconds_bucket{le=\"0.5\"} 1\n"
            "dgemma_latency_seconds_bucket{le=\"1\"} 2\n"
            "dgemma_latency_seconds_bucket{le=\"2.5\"} 2\n"
            "dgemma_latency_seconds_bucket{le=\"+Inf\"} 3\n"
            "dgemma_latency_seconds_sum 8.25\n"
            "dgemma_latency_seconds_count 3\n");
}

TEST(ServeMetrics, HistogramWithLabelsPutsLeLast) {
  MetricsRegistry registry;
  registry.histogram("dgemma_tokens", "Tokens.", {10}, {{"model", "m"}}).observe(3);
  const std::string text = registry.render();
  EXPECT_NE(text.find("dgemma_tokens_bucket{model=\"m\",le=\"10\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dgemma_tokens_bucket{model=\"m\",le=\"+Inf\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dgemma_tokens_sum{model=\"m\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dgemma_tokens_count{model=\"m\"} 1\n"), std::string::npos) << text;
}

TEST(ServeMetrics, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  registry.gauge("g", "Line one\nback\\slash \"quoted\"", {{"path", "a\"b\\c\nd"}}).set(0.5);
  EXPECT_EQ(registry.render(),
            "# HELP g Line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE g gauge\n"
            "g{path=\"a\\\"b\\\\c\\nd\"} 0.5\n");
}

TEST(ServeMetrics, SpecialValues) {
  MetricsRegistry registry;
  registry.gauge("inf", "i").set(std::numeric_limits<double>::infinity());
  registry.gauge("nan", "n").set(std::numeric_limits<double>::quiet_NaN());
  registry.gauge("small", "s").set(1e-7);
  const std::string text = registry.render();
  EXPECT_NE(text.find("inf +Inf\n"), std::string::npos);
  EXPECT_NE(text.find("nan NaN\n"), std::string::npos);
  EXPECT_NE(text.find("small 1e-07\n"), std::string::npos) << text;
}

TEST(ServeMetrics, SameSeriesIsTheSameObject) {
  MetricsRegistry registry;
  Counter& a = registry.counter("c", "h", {{"k", "v"}});
  EXPECT_EQ(&a, &registry.counter("c", "h", {{"k", "v"}}));
  EXPECT_NE(&a, &registry.counter("c", "h", {{"k", "w"}}));
}

TEST(ServeMetrics, RefusesInvalidRegistrations) {
  MetricsRegistry registry;
  registry.counter("c", "h");
  EXPECT_THROW(registry.gauge("c_total", "h"), std::invalid_argument);  // same family, another type
  EXPECT_THROW(registry.counter("c", "other help"), std::invalid_argument);
  EXPECT_THROW(registry.counter("1bad", "h"), std::invalid_argument);
  EXPECT_THROW(registry.counter("bad-name", "h"), std::invalid_argument);
  EXPECT_THROW(registry.counter("ok", "h", {{"bad label", "v"}}), std::invalid_argument);
  EXPECT_THROW(registry.counter("ok", "h", {{"__reserved", "v"}}), std::invalid_argument);
  EXPECT_THROW(registry.histogram("h", "h", {1, 1}), std::invalid_argument);
  registry.histogram("h2", "h", {1, 2});
  EXPECT_THROW(registry.histogram("h2", "h", {1, 3}), std::invalid_argument);
  EXPECT_THROW(registry.counter("c", "h").inc(-1), std::invalid_argument);
  EXPECT_NO_THROW(registry.counter("ns:sub_metric", "h"));
}

TEST(ServeMetrics, ConcurrentIncrementsAreNotLost) {
  MetricsRegistry registry;
  constexpr int kThreads = 4, kIncrements = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        registry.counter("hits", "h").inc();
        registry.histogram("obs", "h", {0.5}).observe(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(registry.counter("hits", "h").value(), kThreads * kIncrements);
  EXPECT_EQ(registry.histogram("obs", "h", {0.5}).count(), uint64_t{kThreads * kIncrements});
  EXPECT_EQ(registry.histogram("obs", "h", {0.5}).sum(), kThreads * kIncrements);
}

}  // namespace
}  // namespace dgemma::serve
