// JobView (see job_view.h). Thread-safety: as documented there; the fetch threads of one
// snapshot only write their own slot of `answers`, joined before it is read.
#include "cohort/metrics/job_view.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include "cohort/base/settings.h"

namespace cohort::metrics {
namespace {

using json = nlohmann::json;

constexpr size_t kHistoryPerNode = 50;
constexpr size_t kLogsPerRank = 100;
constexpr int kMaxFetchThreads = 16;

// "http://host:port/path" -> ("http://host:port", "/path").
std::pair<std::string, std::string> SplitUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t path = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (path == std::string::npos) return {url, "/"};
  return {url.substr(0, path), url.substr(path)};
}

const json& At(const json& j, const char* key) {
  static const json kNull;
  return j.is_object() && j.contains(key) ? j[key] : kNull;
}

json Num(const json& metrics, const std::string& key) {
  const json& v = At(metrics, key.c_str());
  return v.is_number() ? v : json();
}

// Sum of every metric whose flattened key starts with `prefix` (all label sets).
json SumPrefix(const json& metrics, const std::string& prefix) {
  double sum = 0;
  bool any = false;
  if (metrics.is_object()) {
    for (const auto& [k, v] : metrics.items()) {
      if (k.rfind(prefix, 0) == 0 && v.is_number()) {
        sum += v.get<double>();
        any = true;
      }
    }
  }
  return any ? json(sum) : json();
}

std::string GpuSummary(const json& gpus) {
  if (!At(gpus, "available").is_boolean() || !gpus["available"].get<bool>()) {
    const json& reason = At(gpus, "reason");
    return "not monitored" + (reason.is_string() ? ": " + reason.get<std::string>() : "");
  }
  std::string out;
  for (const auto& d : At(gpus, "devices")) {
    out += fmt::format("{}GPU {} {:.0f}% {:.1f} GiB", out.empty() ? "" : "; ",
                       d.value("index", 0), d.value("utilization_percent", 0.0),
                       d.value("memory_used_bytes", 0.0) / double(1 << 30));
  }
  return out;
}

}  // namespace

Result<json> FetchJson(const std::string& url, Duration timeout) {
  auto [base, path] = SplitUrl(url);
  httplib::Client client(base);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  client.set_connection_timeout(us / 1000000, us % 1000000);
  client.set_read_timeout(us / 1000000, us % 1000000);
  client.set_write_timeout(us / 1000000, us % 1000000);
  auto res = client.Get(path);
  if (!res) return Unavailable("no answer from {}: {}", base, httplib::to_string(res.error()));
  if (res->status != 200) return Unavailable("{} answered HTTP {}", url, res->status);
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded()) return Unavailable("{} did not answer JSON", url);
  return j;
}

json RankRows(const json& state) {
  std::map<int, json> metrics, usage;
  std::map<int, std::string> states;
  for (const auto& r : At(state, "ranks")) metrics[r.value("rank", -1)] = At(r, "metrics");
  for (const auto& w : At(At(state, "system"), "workers")) usage[w.value("rank", -1)] = w;
  for (const auto& r : At(At(state, "agent"), "ranks")) {
    states[r.value("rank", -1)] = r.value("state", std::string("-"));
  }
  std::set<int> ranks;
  for (const auto& [r, _] : metrics) ranks.insert(r);
  for (const auto& [r, _] : states) ranks.insert(r);
  json rows = json::array();
  for (int rank : ranks) {
    if (rank < 0) continue;
    const json& m = metrics.count(rank) ? metrics[rank] : json();
    const json& u = usage.count(rank) ? usage[rank] : json();
    json wait = Num(m, "cohort_train_comm_wait_fraction");
    if (wait.is_null()) wait = Num(m, "cohort_comm_wait_fraction");
    rows.push_back({{"rank", rank},
                    {"state", states.count(rank) ? states[rank] : std::string("-")},
                    {"step", Num(m, "cohort_train_step")},
                    {"loss", Num(m, "cohort_train_loss")},
                    {"samples_per_s", Num(m, "cohort_train_samples_per_second")},
                    {"comm_wait", wait},
                    {"comm_operations", SumPrefix(m, "cohort_comm_operations_total")},
                    {"comm_bytes", SumPrefix(m, "cohort_comm_bytes_total")},
                    {"comm_seconds", SumPrefix(m, "cohort_comm_seconds_total")},
                    {"cpu_percent", Num(u, "cpu_percent")},
                    {"rss_bytes", Num(u, "rss_bytes")}});
  }
  return rows;
}

void JobView::Absorb(Known& k, Result<json> answer, double now) {
  if (!answer.ok()) {
    k.error = answer.status().message();
    return;
  }
  json& s = *answer;
  // A loopback-only endpoint published by an agent on another host names this host's
  // loopback: whoever answers there is not that agent.
  const json& agent = At(s, "agent");
  if (At(agent, "pid").is_number() && k.record.contains("pid") &&
      (agent["pid"] != k.record["pid"] || agent.value("host", "") != k.record.value("host", ""))) {
    k.error = fmt::format("another agent answers at {} (pid {} on {}): start the agents with "
                          "--metrics-host 0.0.0.0 so that they reach each other",
                          k.record.value("url", ""), agent["pid"].dump(), agent.value("host", ""));
    return;
  }
  k.error.clear();
  k.last_seen = now;
  for (const auto& e : At(s, "events")) {
    k.since = std::max<uint64_t>(k.since, e.value("seq", uint64_t{0}));
    const std::string type = e.value("type", "");
    if (type == "log") {
      const int rank = e.value("rank", -1);
      auto& lines = k.logs[rank];
      lines.push_back({{"time", e.value("time", now)}, {"rank", rank}, {"line", e.value("line", "")}});
      if (lines.size() > kLogsPerRank) lines.pop_front();
    } else {
      k.history.push_back(e);
      if (k.history.size() > kHistoryPerNode) k.history.pop_front();
    }
  }
  s.erase("events");
  k.state = std::move(s);
}

json JobView::Snapshot(int rank) {
  MutexLock lock(&mu_);
  if (!fresh_until_ || fresh_until_->expired()) Poll();
  json out = last_;
  json logs = json::array();
  for (const auto& l : last_logs_) {
    if (rank < 0 || l["rank"] == rank) logs.push_back(l);
  }
  if (logs.size() > o_.log_lines) logs.erase(logs.begin(), logs.end() - o_.log_lines);
  out["logs"] = std::move(logs);
  return out;
}

void JobView::Poll() {
  auto listed = o_.list();
  if (listed.ok()) {
    directory_error_.clear();
    for (auto& e : *listed) {
      Known& k = known_[e.index];
      k.record = std::move(e.record);
      k.end = std::move(e.end);
    }
  } else {
    directory_error_ = listed.status().message();
  }
  // Ask every agent at once (bounded threads); each writes only its own answer.
  std::vector<std::pair<Known*, std::string>> asks;
  for (auto& [index, k] : known_) {
    const std::string url = k.record.value("url", "");
    if (!url.empty()) asks.emplace_back(&k, fmt::format("{}api/state?since={}", url, k.since));
  }
  std::vector<std::optional<Result<json>>> answers(asks.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < asks.size();) {
      answers[i] = FetchJson(asks[i].second, o_.fetch_timeout);
    }
  };
  std::vector<std::thread> threads;
  const size_t n = std::min<size_t>(asks.size(), kMaxFetchThreads);
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  const double now = WallSeconds();
  for (size_t i = 0; i < asks.size(); ++i) Absorb(*asks[i].first, std::move(*answers[i]), now);
  last_ = Build(now, &last_logs_);
  fresh_until_ = Deadline::After(o_.reuse);
}

json JobView::Build(double now, json* logs_out) {
  // Events of the nodes that answer, for the cause of a node that does not.
  std::vector<json> survivors_history;
  for (const auto& [index, k] : known_) {
    if (!k.error.empty()) continue;
    for (const auto& e : k.history) {
      if (e.value("type", "") != "round" || e.value("cause", "") != "start") {
        survivors_history.push_back(e);
      }
    }
  }
  json nodes = json::array(), logs = json::array();
  json summary = {{"nodes", 0}, {"running", 0}, {"lost", 0}, {"finished", 0}, {"failed", 0},
                  {"ranks", 0}, {"samples_per_s", 0.0}, {"world_size", 0}};
  for (const auto& [index, k] : known_) {
    const json& agent = At(k.state, "agent");
    const std::string addr = k.record.value("addr", ""), host = k.record.value("host", "");
    std::string state, cause;
    if (k.error.empty()) {
      state = agent.value("state", std::string("UNKNOWN"));
    } else if (k.end) {
      state = k.end->value("state", std::string("FINISHED"));
      cause = k.end->value("summary", "");
      if (cause.empty()) cause = fmt::format("its agent exited with code {}", k.end->value("exit_code", 0));
    } else {
      state = "LOST";
      // The survivors' record of the job going on without it: the event that names its
      // address, else the first one after it was last seen.
      const json* named = nullptr;
      const json* after = nullptr;
      for (const auto& e : survivors_history) {
        const std::string c = e.value("cause", "");
        if (!addr.empty() && c.find(addr) != std::string::npos) named = &e;
        if (!after && e.value("time", 0.0) >= k.last_seen - 1) after = &e;
      }
      const json* why = named ? named : after;
      cause = why ? fmt::format("{} (recorded by the survivors, round {})", why->value("cause", ""),
                                why->value("round", -1))
                  : std::string();
      cause += fmt::format("{}no answer from its agent {}: {}", cause.empty() ? "" : "; ",
                           k.last_seen > 0 ? fmt::format("for {:.0f} s", now - k.last_seen)
                                           : std::string("yet"),
                           k.error);
    }
    json ranks = RankRows(k.state);
    const bool running = k.error.empty();
    if (!running) {
      if (state == "LOST") {
        for (auto& r : ranks) r["state"] = "LOST";
      }
    }
    const json& sys = At(k.state, "system");
    json history = json::array();
    for (const auto& e : k.history) history.push_back(e);
    nodes.push_back({{"index", index},
                     {"host", host},
                     {"addr", addr},
                     {"url", k.record.value("url", "")},
                     {"pid", k.record.value("pid", 0)},
                     {"state", state},
                     {"reachable", running},
                     {"cause", cause},
                     {"last_seen", k.last_seen},
                     {"round", At(agent, "round")},
                     {"world_size", At(agent, "world_size")},
                     {"group_rank", At(agent, "group_rank")},
                     {"restarts", At(agent, "restarts")},
                     {"max_restarts", At(agent, "max_restarts")},
                     {"cpu_percent", running ? At(At(sys, "node"), "cpu_percent") : json()},
                     {"gpus", GpuSummary(At(sys, "gpus"))},
                     {"ranks", ranks},
                     {"events", history}});
    summary["nodes"] = summary["nodes"].get<int>() + 1;
    const char* bucket = running ? "running" : state == "LOST" ? "lost"
                         : state == "SUCCEEDED"                ? "finished"
                                                               : "failed";
    summary[bucket] = summary[bucket].get<int>() + 1;
    if (running) {
      summary["ranks"] = summary["ranks"].get<int>() + static_cast<int>(ranks.size());
      for (const auto& r : ranks) {
        if (r["samples_per_s"].is_number()) {
          summary["samples_per_s"] = summary["samples_per_s"].get<double>() +
                                     r["samples_per_s"].get<double>();
        }
      }
      if (At(agent, "world_size").is_number()) {
        summary["world_size"] = std::max(summary["world_size"].get<int>(),
                                         agent["world_size"].get<int>());
      }
    }
    for (const auto& [rank, lines] : k.logs) {
      for (const auto& l : lines) {
        logs.push_back({{"time", l["time"]}, {"node", index}, {"host", host}, {"addr", addr},
                        {"rank", rank}, {"line", l["line"]}});
      }
    }
  }
  std::stable_sort(logs.begin(), logs.end(), [](const json& a, const json& b) {
    return a["time"].get<double>() < b["time"].get<double>();
  });
  *logs_out = std::move(logs);
  json run_id = nullptr;
  for (const auto& [index, k] : known_) {
    if (At(At(k.state, "agent"), "run_id").is_string()) run_id = k.state["agent"]["run_id"];
  }
  return {{"time", now}, {"run_id", run_id}, {"summary", summary}, {"nodes", nodes},
          {"directory_error", directory_error_}};
}

}  // namespace cohort::metrics
