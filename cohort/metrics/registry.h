// Metrics: counters, gauges and histograms in a registry, rendered in the Prometheus text
// exposition format (version 0.0.4) and as JSON. The agent, comm and train record into the
// process-wide DefaultRegistry(); workers export theirs to files the agent serves (see
// exporter.h), so one scrape of an agent shows the node and every local rank.
//
// Names follow Prometheus conventions (cohort_<subsystem>_<what>_<unit>, counters end in
// _total). A metric is identified by name + labels; asking again returns the same object.
//
// Thread-safety: registration takes a mutex (Registry::mu_ guards the family map);
// Counter/Gauge/Histogram updates are lock-free (atomics) and may come from any thread;
// rendering takes the registry mutex. StatusBoard and EventLog each guard their contents
// with their own mutex; all their methods are safe from any thread.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/base/mutex.h"

namespace cohort::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Add(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  struct Snapshot {
    std::vector<double> bounds;           // upper bounds, ascending (+Inf implied)
    std::vector<uint64_t> cumulative;     // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Get() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

// Default latency buckets in seconds (100 us .. 60 s).
std::vector<double> SecondsBuckets();

class Registry {
 public:
  Counter& GetCounter(std::string_view name, std::string_view help, const Labels& labels = {})
      COHORT_EXCLUDES(mu_);
  Gauge& GetGauge(std::string_view name, std::string_view help, const Labels& labels = {})
      COHORT_EXCLUDES(mu_);
  Histogram& GetHistogram(std::string_view name, std::string_view help,
                          const std::vector<double>& bounds, const Labels& labels = {})
      COHORT_EXCLUDES(mu_);

  // Every metric as JSON: [{"name","type","help","labels":{...},"value"| "buckets",...}].
  nlohmann::json ToJson() const COHORT_EXCLUDES(mu_);
  std::string PrometheusText() const COHORT_EXCLUDES(mu_);

 private:
  struct Family {
    std::string type, help;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };
  Family& FamilyFor(std::string_view name, std::string_view help, const char* type)
      COHORT_REQUIRES(mu_);
  mutable Mutex mu_;
  std::map<std::string, Family> families_ COHORT_GUARDED_BY(mu_);
};

Registry& DefaultRegistry();

// Renders metrics in the JSON form of Registry::ToJson (from several sources, e.g. the
// agent's registry and each rank's exported file, with `extra` labels added per source) as
// one Prometheus text document: each family's HELP/TYPE once, then all its samples.
struct Source {
  nlohmann::json metrics;  // Registry::ToJson() output
  Labels extra;            // added to every sample, e.g. {{"rank","3"}}
};
std::string RenderPrometheus(const std::vector<Source>& sources);

// The latest state of a component as one JSON document (the agent's, for the dashboard):
// replaced whole by its owner, read by the HTTP server.
class StatusBoard {
 public:
  void Set(nlohmann::json state) COHORT_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    state_ = std::move(state);
  }
  nlohmann::json Get() const COHORT_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return state_;
  }

 private:
  mutable Mutex mu_;
  nlohmann::json state_ COHORT_GUARDED_BY(mu_) = nlohmann::json::object();
};

// Recent events for the dashboard (restarts with their causes, log lines): a bounded,
// thread-safe ring of JSON objects with a sequence number each.
class EventLog {
 public:
  explicit EventLog(size_t capacity) : capacity_(capacity) {}
  // Adds "seq" and "time" (unix seconds).
  void Add(nlohmann::json event) COHORT_EXCLUDES(mu_);
  // Events with seq > `seq`, oldest first.
  nlohmann::json Since(uint64_t seq) const COHORT_EXCLUDES(mu_);

 private:
  size_t capacity_;
  mutable Mutex mu_;
  std::deque<nlohmann::json> events_ COHORT_GUARDED_BY(mu_);
  uint64_t next_seq_ COHORT_GUARDED_BY(mu_) = 1;
};

}  // namespace cohort::metrics
