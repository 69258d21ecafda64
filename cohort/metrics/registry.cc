// Metrics registry and Prometheus rendering (see registry.h).
// Thread-safety: as documented in the header (each class's mu_ guards its maps/state).
#include "cohort/metrics/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "cohort/base/time.h"

namespace cohort::metrics {
namespace {

void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

// Prometheus text escapes: backslash and newline in HELP text; label values also escape
// the double quote that delimits them.
std::string Escape(const std::string& v, bool label_value) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && label_value) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string LabelText(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    out += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first,
                       Escape(labels[i].second, /*label_value=*/true));
  }
  return out + "}";
}

nlohmann::json LabelsJson(const Labels& labels) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : labels) out[k] = v;
  return out;
}

}  // namespace

void Counter::Add(double v) {
  if (v > 0) AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Get() const {
  Snapshot s;
  s.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  s.count = running;
  return s;
}

std::vector<double> SecondsBuckets() {
  return {1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

Registry::Family& Registry::FamilyFor(std::string_view name, std::string_view help,
                                      const char* type) {
  auto [it, inserted] = families_.try_emplace(std::string(name));
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  return it->second;
}

Counter& Registry::GetCounter(std::string_view name, std::string_view help,
                              const Labels& labels) {
  MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, "counter").counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::GetGauge(std::string_view name, std::string_view help, const Labels& labels) {
  MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, "gauge").gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::GetHistogram(std::string_view name, std::string_view help,
                                  const std::vector<double>& bounds, const Labels& labels) {
  MutexLock lock(&mu_);
  auto& slot = FamilyFor(name, help, "histogram").histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

nlohmann::json Registry::ToJson() const {
  MutexLock lock(&mu_);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& entry : families_) {
    const std::string& name = entry.first;  // not a structured binding: the lambda captures it
    const Family& f = entry.second;
    auto base = [&](const Labels& labels) {
      return nlohmann::json{{"name", name}, {"type", f.type}, {"help", f.help},
                            {"labels", LabelsJson(labels)}};
    };
    for (const auto& [labels, c] : f.counters) {
      auto m = base(labels);
      m["value"] = c->Value();
      out.push_back(std::move(m));
    }
    for (const auto& [labels, g] : f.gauges) {
      auto m = base(labels);
      m["value"] = g->Value();
      out.push_back(std::move(m));
    }
    for (const auto& [labels, h] : f.histograms) {
      auto m = base(labels);
      Histogram::Snapshot s = h->Get();
      m["bounds"] = s.bounds;
      m["cumulative"] = s.cumulative;
      m["sum"] = s.sum;
      m["count"] = s.count;
      out.push_back(std::move(m));
    }
  }
  return out;
}

std::string Registry::PrometheusText() const { return RenderPrometheus({{ToJson(), {}}}); }

Registry& DefaultRegistry() {
  static Registry* registry = new Registry();  // never destroyed: threads may still record
  return *registry;
}

std::string RenderPrometheus(const std::vector<Source>& sources) {
  struct Family {
    std::string type, help;
    std::vector<std::string> lines;
  };
  std::map<std::string, Family> families;
  for (const auto& src : sources) {
    if (!src.metrics.is_array()) continue;
    for (const auto& m : src.metrics) {
      const std::string name = m.value("name", "");
      if (name.empty()) continue;
      Family& f = families[name];
      if (f.type.empty()) {
        f.type = m.value("type", "untyped");
        f.help = m.value("help", "");
      }
      Labels labels;
      if (m.contains("labels") && m["labels"].is_object()) {
        for (const auto& [k, v] : m["labels"].items()) {
          labels.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
        }
      }
      labels.insert(labels.end(), src.extra.begin(), src.extra.end());
      if (f.type == "histogram") {
        auto bounds = m.value("bounds", std::vector<double>{});
        auto cumulative = m.value("cumulative", std::vector<uint64_t>{});
        for (size_t i = 0; i < cumulative.size(); ++i) {
          Labels with_le = labels;
          with_le.emplace_back("le", i < bounds.size() ? FormatValue(bounds[i]) : "+Inf");
          f.lines.push_back(fmt::format("{}_bucket{} {}", name, LabelText(with_le),
                                        cumulative[i]));
        }
        f.lines.push_back(fmt::format("{}_sum{} {}", name, LabelText(labels),
                                      FormatValue(m.value("sum", 0.0))));
        f.lines.push_back(fmt::format("{}_count{} {}", name, LabelText(labels),
                                      m.value("count", uint64_t{0})));
      } else {
        f.lines.push_back(fmt::format("{}{} {}", name, LabelText(labels),
                                      FormatValue(m.value("value", 0.0))));
      }
    }
  }
  std::string out;
  for (const auto& [name, f] : families) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name,
                       Escape(f.help, /*label_value=*/false), name, f.type);
    for (const auto& l : f.lines) out += l + "\n";
  }
  return out;
}

void EventLog::Add(nlohmann::json event) {
  MutexLock lock(&mu_);
  event["seq"] = next_seq_++;
  event["time"] = WallSeconds();
  events_.push_back(std::move(event));
  while (events_.size() > capacity_) events_.pop_front();
}

nlohmann::json EventLog::Since(uint64_t seq) const {
  MutexLock lock(&mu_);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : events_) {
    if (e.value("seq", uint64_t{0}) > seq) out.push_back(e);
  }
  return out;
}

}  // namespace cohort::metrics
