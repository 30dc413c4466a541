// A small thread-safe metrics registry for GET /metrics (docs/serving.md, "Metrics"), rendered in
// the Prometheus text exposition format 0.0.4:
//
//   # HELP dgemma_requests_total Requests received.
//   # TYPE dgemma_requests_total counter
//   dgemma_requests_total{endpoint="chat"} 12
//
// A metric family is a name with its help and type; each distinct label set is one series of it.
// Counter names end in "_total" (added when the given name lacks it, as Prometheus' clients do).
// Histograms render cumulative _bucket{le="..."} series ending in le="+Inf", then _sum and _count.
// Updates are lock-free atomics; registration and rendering take the registry's lock. A histogram's
// series are read one by one, so a render that races an observation may show it in some of them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dgemma::serve {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;  // name, value; rendered in this order

class Counter {
 public:
  void inc(double amount = 1);  // amount >= 0 (a counter only goes up)
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `upperBounds`: strictly increasing, finite; the +Inf bucket is implicit.
  explicit Histogram(std::vector<double> upperBounds);
  void observe(double value);

  const std::vector<double>& upperBounds() const { return upperBounds_; }
  // Observations <= upperBounds()[i] (cumulative); i == upperBounds().size() is +Inf, the count.
  uint64_t cumulativeCount(size_t bucket) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> upperBounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket, not cumulative; the last is +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

class MetricsRegistry {
 public:
  // The series of `name` with `labels`, created on first use; the same reference every later time.
  // Throws std::invalid_argument for a name or label name Prometheus does not allow, and when `name`
  // is already registered with another type, help or (histograms) buckets. Families render in the
  // order they were first registered.
  Counter& counter(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& buckets,
                       const MetricLabels& labels = {});

  std::string render() const;

 private:
  enum class Type { Counter, Gauge, Histogram };
  struct Family {
    std::string name;  // counters: with _total
    std::string help;
    Type type;
    std::vector<double> buckets;
    std::map<MetricLabels, std::unique_ptr<Counter>> counters;
    std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
    std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
  };

  Family& family(const std::string& name, const std::string& help, Type type, const MetricLabels& labels,
                 const std::vector<double>& buckets);

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_;
};

// The content type of render()'s text.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace dgemma::serve
