#include "runtime/serve/api/Metrics.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace dgemma::serve {
namespace {

bool isNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool isNameChar(char c) { return isNameStart(c) || (c >= '0' && c <= '9'); }

// Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names: [a-zA-Z_][a-zA-Z0-9_]*, "__" prefix reserved.
void checkName(const std::string& name, bool isLabel) {
  bool valid = !name.empty() && (isNameStart(name[0]) || (!isLabel && name[0] == ':'));
  for (char c : name) valid = valid && (isNameChar(c) || (!isLabel && c == ':'));
  if (isLabel && name.starts_with("__")) valid = false;
  if (isLabel && name == "le") valid = false;  // histograms' bucket label; refused for every type to keep it simple
  if (!valid) {
    throw std::invalid_argument(std::string(isLabel ? "label" : "metric") + " name \"" + name +
                                "\" is not allowed by Prometheus");
  }
}

// A sample value as Prometheus parses it: shortest round-trip form, +Inf, -Inf, NaN.
std::string formatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string escape(const std::string& text, bool inQuotes) {
  std::string escaped;
  for (char c : text) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else if (c == '"' && inQuotes) {
      escaped += "\\\"";
    } else {
      escaped.push_back(c);
    }
  }
  return escaped;
}

// {a="x",b="y"} with `extra` (le) last; "" for no labels.
std::string labelText(const MetricLabels& labels, const std::string& extraName = "",
                      const std::string& extraValue = "") {
  std::string text;
  auto add = [&](const std::string& name, const std::string& value) {
    text += (text.empty() ? "{" : ",") + name + "=\"" + escape(value, true) + "\"";
  };
  for (const auto& [name, value] : labels) add(name, value);
  if (!extraName.empty()) add(extraName, extraValue);
  return text.empty() ? text : text + "}";
}

void atomicAdd(std::atomic<double>& target, double amount) { target.fetch_add(amount, std::memory_order_relaxed); }

}  // namespace

void Counter::inc(double amount) {
  if (!(amount >= 0)) throw std::invalid_argument("a counter can only increase, got " + formatValue(amount));
  atomicAdd(value_, amount);
}

Histogram::Histogram(std::vector<double> upperBounds)
    : upperBounds_(std::move(upperBounds)), buckets_(new std::atomic<uint64_t>[upperBounds_.size() + 1]) {
  for (size_t i = 0; i < upperBounds_.size(); ++i) {
    if (!std::isfinite(upperBounds_[i]) || (i > 0 && !(upperBounds_[i] > upperBounds_[i - 1]))) {
      throw std::invalid_argument("histogram buckets must be finite and strictly increasing");
    }
  }
  for (size_t i = 0; i <= upperBounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double value) {
  size_t bucket = 0;
  while (bucket < upperBounds_.size() && !(value <= upperBounds_[bucket])) ++bucket;
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  atomicAdd(sum_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Histogram::cumulativeCount(size_t bucket) const {
  uint64_t total = 0;
  for (size_t i = 0; i <= bucket && i <= upperBounds_.size(); ++i) total += buckets_[i].load(std::memory_order_relaxed);
  return total;
}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help, Type type,
                                                 const MetricLabels& labels, const std::vector<double>& buckets) {
  checkName(name, false);
  for (const auto& [labelName, value] : labels) checkName(labelName, true);
  const std::string fullName = type == Type::Counter && !name.ends_with("_total") ? name + "_total" : name;
  for (const auto& existing : families_) {
    if (existing->name != fullName) continue;
    if (existing->type != type || existing->help != help || existing->buckets != buckets) {
      throw std::invalid_argument("metric \"" + fullName +
                                  "\" is already registered with another type, help or buckets");
    }
    return *existing;
  }
  families_.push_back(std::make_unique<Family>(Family{fullName, help, type, buckets, {}, {}, {}}));
  return *families_.back();
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const MetricLabels& labels) {
  std::lock_guard lock(mutex_);
  auto& series = family(name, help, Type::Counter, labels, {}).counters[labels];
  if (!series) series = std::make_unique<Counter>();
  return *series;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const MetricLabels& labels) {
  std::lock_guard lock(mutex_);
  auto& series = family(name, help, Type::Gauge, labels, {}).gauges[labels];
  if (!series) series = std::make_unique<Gauge>();
  return *series;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& buckets, const MetricLabels& labels) {
  std::lock_guard lock(mutex_);
  // Validates the buckets before the family records them.
  auto created = std::make_unique<Histogram>(buckets);
  auto& series = family(name, help, Type::Histogram, labels, buckets).histograms[labels];
  if (!series) series = std::move(created);
  return *series;
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mutex_);
  std::string text;
  for (const auto& family : families_) {
    static const char* kTypeNames[] = {"counter", "gauge", "histogram"};
    text += "# HELP " + family->name + " " + escape(family->help, false) + "\n";
    text += "# TYPE " + family->name + " " + kTypeNames[static_cast<int>(family->type)] + "\n";
    for (const auto& [labels, counter] : family->counters) {
      text += family->name + labelText(labels) + " " + formatValue(counter->value()) + "\n";
    }
    for (const auto& [labels, gauge] : family->gauges) {
      text += family->name + labelText(labels) + " " + formatValue(gauge->value()) + "\n";
    }
    for (const auto& [labels, histogram] : family->histograms) {
      const std::vector<double>& bounds = histogram->upperBounds();
      for (size_t i = 0; i <= bounds.size(); ++i) {
        const std::string le = i < bounds.size() ? formatValue(bounds[i]) : "+Inf";
        text += family->name + "_bucket" + labelText(labels, "le", le) + " " +
                std::to_string(histogram->cumulativeCount(i)) + "\n";
      }
      text += family->name + "_sum" + labelText(labels) + " " + formatValue(histogram->sum()) + "\n";
      text += family->name + "_count" + labelText(labels) + " " +
              std::to_string(histogram->cumulativeCount(bounds.size())) + "\n";
    }
  }
  return text;
}

}  // namespace dgemma::serve
