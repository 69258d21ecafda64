// JobView (see job_view.h). Thread-safety: as documented there; the fetch threads of one
// snapshot only write their own slot of `answers`, joined before it is read.
#include "cohort/metrics/job_view.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <set>
#include <thread>

#include "cohort/base/json_bounded.h"
#include "cohort/metrics/agent_status.h"
#include "cohort/metrics/json_read.h"

namespace cohort::metrics {
namespace {

using json = nlohmann::json;
using namespace json_read;  // NOLINT: the readers of foreign JSON

constexpr size_t kHistoryPerNode = 50;
constexpr size_t kLogsPerRank = 100;
constexpr int kMaxFetchThreads = 16;
constexpr size_t kMaxAnswerBytes = 32u << 20;

// "http://host:port/path" -> ("http://host:port", "/path").
std::pair<std::string, std::string> SplitUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t path = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (path == std::string::npos) return {url, "/"};
  return {url.substr(0, path), url.substr(path)};
}

// Whether `text` names `addr` as a whole address ("10.0.0.1" is not in "10.0.0.12").
bool NamesAddress(const std::string& text, const std::string& addr) {
  if (addr.empty()) return false;
  auto part = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == ':'; };
  for (size_t at = text.find(addr); at != std::string::npos; at = text.find(addr, at + 1)) {
    const size_t end = at + addr.size();
    if ((at == 0 || !part(text[at - 1])) && (end == text.size() || !part(text[end]))) return true;
  }
  return false;
}

bool LoopbackUrl(const std::string& url) {
  for (const char* p : {"http://127.", "http://localhost", "http://[::1]"}) {
    if (url.rfind(p, 0) == 0) return true;
  }
  return false;
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
    const std::string reason = Str(gpus, "reason");
    return "not monitored" + (reason.empty() ? "" : ": " + reason);
  }
  std::string out;
  for (const auto& d : Arr(gpus, "devices")) {
    out += fmt::format("{}GPU {} {:.0f}% {:.1f} GiB", out.empty() ? "" : "; ",
                       Int(d, "index", 0), Dbl(d, "utilization_percent"),
                       Dbl(d, "memory_used_bytes") / double(1 << 30));
  }
  return out;
}

}  // namespace

Result<json> FetchJson(const std::string& url, Duration timeout) {
  if (url.rfind("http://", 0) != 0) {
    return InvalidArgument("'{}' is not an http://host:port/ address", url);
  }
  auto [base, path] = SplitUrl(url);
  httplib::Result res(nullptr, httplib::Error::Unknown);
  std::string body;
  bool too_big = false;
  const Deadline deadline = Deadline::After(timeout);
  try {
    httplib::Client client(base);  // throws on a port that is not a number
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
    client.set_connection_timeout(us / 1000000, us % 1000000);
    client.set_read_timeout(us / 1000000, us % 1000000);
    client.set_write_timeout(us / 1000000, us % 1000000);
    // httplib's timeouts bound each read, not the answer: an agent that sends a byte a
    // second would hold the caller for ever. The whole exchange gets `timeout`: a watchdog
    // stops the client then (slow headers included), and the body reader stops at the
    // deadline or past kMaxAnswerBytes.
    Mutex mu;
    CondVar cv;
    bool done = false;
    std::thread watchdog([&] {
      MutexLock lock(&mu);
      while (!done) {
        if (!cv.WaitUntil(&mu, deadline)) {
          client.stop();
          return;
        }
      }
    });
    res = client.Get(path, [&](const char* data, size_t n) {
      if (body.size() + n > kMaxAnswerBytes) {
        too_big = true;
        return false;
      }
      body.append(data, n);
      return !deadline.expired();
    });
    {
      MutexLock lock(&mu);
      done = true;
      cv.SignalAll();
    }
    watchdog.join();
  } catch (const std::exception& e) {
    return InvalidArgument("'{}' is not an http://host:port/ address: {}", url, e.what());
  }
  if (too_big) return Unavailable("{} answered more than {} MiB", url, kMaxAnswerBytes >> 20);
  if (deadline.expired() && (!res || res->status == 200)) {
    return Unavailable("no whole answer from {} within {:.1f} s", base,
                       std::chrono::duration<double>(timeout).count());
  }
  if (!res) return Unavailable("no answer from {}: {}", base, httplib::to_string(res.error()));
  if (res->status != 200) return Unavailable("{} answered HTTP {}", url, res->status);
  // Another node's answer: bounded in size and nesting, so a hostile or broken agent cannot
  // crash the one that asks (a 100,000-deep array took its stack).
  json j = ParseJsonBounded(body, kMaxAnswerBytes);
  if (j.is_discarded()) {
    return Unavailable("{} did not answer JSON (or answered more than {} MiB or nested "
                       "deeper than {})", url, kMaxAnswerBytes >> 20, kJsonMaxDepth);
  }
  return j;
}

json RankRows(const json& state) {
  std::map<int, json> metrics, usage;
  std::map<int, std::string> states;
  for (const auto& r : Arr(state, "ranks")) metrics[Int(r, "rank", -1)] = At(r, "metrics");
  for (const auto& w : Arr(At(state, "system"), "workers")) usage[Int(w, "rank", -1)] = w;
  const AgentStatus agent = AgentStatus::FromJson(At(state, "agent"));
  for (const auto& r : agent.ranks) states[r.rank] = r.state;
  // The agent's own list is the authority on its ranks: a snapshot file left by a worker of
  // an earlier attempt (under a rank it no longer has) is not a rank of this node.
  std::set<int> ranks;
  for (const auto& [r, _] : states) ranks.insert(r);
  if (!agent.has_ranks) {
    for (const auto& [r, _] : metrics) ranks.insert(r);
  }
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
  if (answer.ok() && !answer->is_object()) answer = Unavailable("the answer is not an object");
  if (answer.ok()) {
    // The answer is from the agent that published this entry (pid and host), not from
    // another one listening at the same address: a replaced agent on a fixed port, or a
    // loopback address published by an agent of another host.
    // An answer that names no pid is not from that agent either.
    const AgentStatus agent = AgentStatus::FromJson(At(*answer, "agent"));
    if (At(k.record, "pid").is_number() &&
        (agent.pid == 0 || agent.pid != Int(k.record, "pid", -1) ||
         agent.host != Str(k.record, "host"))) {
      answer = Unavailable(
          "another agent (pid {} on {}) answers at {}: this node's agent was replaced, or it "
          "listens on loopback only (--metrics-host 0.0.0.0 lets other hosts reach it)",
          agent.pid == 0 ? std::string("null") : std::to_string(agent.pid), agent.host,
          Str(k.record, "url"));
    }
  }
  if (!answer.ok()) {
    k.error = answer.status().message();
    if (LoopbackUrl(Str(k.record, "url")) && answer.status().code() == StatusCode::kUnavailable &&
        k.error.find("--metrics-host") == std::string::npos) {
      k.error += " (a loopback address: if that agent runs on another host, start the agents "
                 "with --metrics-host 0.0.0.0)";
    }
    if (k.failing_since == 0) k.failing_since = now;
    // Not answering for a while: asked every 10 s, not every poll.
    if (now - k.failing_since > 10) k.retry_at = Deadline::AfterMs(10000);
    return;
  }
  k.error.clear();
  k.failing_since = 0;
  k.retry_at.reset();
  k.last_seen = now;
  json& s = *answer;
  for (const auto& e : Arr(s, "events")) {
    if (!e.is_object()) continue;
    k.since = std::max<uint64_t>(k.since, At(e, "seq").is_number_unsigned() ? e["seq"].get<uint64_t>() : 0);
    if (Str(e, "type") == "log") {
      const int rank = Int(e, "rank", -1);
      auto& lines = k.logs[rank];
      lines.push_back({{"time", Dbl(e, "time", now)}, {"rank", rank}, {"line", Str(e, "line")}});
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
  bool poll = false;
  {
    MutexLock lock(&mu_);
    // The first snapshot: wait for the poll in progress (bounded), later ones do not.
    const Deadline first = Deadline::After(o_.fetch_timeout * 4);
    while (polling_ && last_.is_null() && polled_.WaitUntil(&mu_, first)) {
    }
    if (!polling_ && (!fresh_until_ || fresh_until_->expired())) poll = polling_ = true;
  }
  if (poll) Poll();
  MutexLock lock(&mu_);
  json out = last_.is_null() ? json{{"nodes", json::array()}, {"summary", json::object()}} : last_;
  json logs = json::array();
  for (const auto& l : last_logs_) {
    if (rank < 0 || l["rank"] == rank) logs.push_back(l);
  }
  if (logs.size() > o_.log_lines) logs.erase(logs.begin(), logs.end() - o_.log_lines);
  out["logs"] = std::move(logs);
  return out;
}

void JobView::Poll() {
  // polling_ is ours: only this thread calls list and changes known_'s entries' set.
  auto listed = o_.list();
  struct Ask {
    int index;
    std::string url;
  };
  std::vector<Ask> asks;
  {
    MutexLock lock(&mu_);
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
    for (auto& [index, k] : known_) {
      const std::string url = Str(k.record, "url");
      // An agent that recorded its end is not asked again: its last answer stays.
      if (url.empty() || k.end) continue;
      if (k.retry_at && !k.retry_at->expired()) continue;
      asks.push_back({index, fmt::format("{}api/state?since={}", url, k.since)});
    }
  }
  // Ask every agent at once (bounded threads, no lock held); each writes only its slot.
  std::vector<std::optional<Result<json>>> answers(asks.size());
  std::atomic<size_t> next{0};
  // The whole poll is bounded too: asks not started by then wait for the next poll.
  const Deadline poll_deadline = Deadline::After(o_.fetch_timeout * 4);
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < asks.size();) {
      answers[i] = poll_deadline.expired()
                       ? Result<json>(Unavailable("not asked: the poll of {} agents ran out of "
                                                  "time", asks.size()))
                       : FetchJson(asks[i].url, o_.fetch_timeout);
    }
  };
  std::vector<std::thread> threads;
  const size_t n = std::min<size_t>(asks.size(), kMaxFetchThreads);
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  const double now = WallSeconds();
  MutexLock lock(&mu_);
  for (size_t i = 0; i < asks.size(); ++i) {
    Absorb(known_[asks[i].index], std::move(*answers[i]), now);
  }
  last_ = Build(now, &last_logs_);
  fresh_until_ = Deadline::After(o_.reuse);
  polling_ = false;
  polled_.SignalAll();
}

// A node's state and, when it does not answer, why (see the header).
std::pair<std::string, std::string> JobView::StateAndCause(
    const Known& k, const std::vector<json>& survivors_history, double now) {
  // A node that recorded its end is shown by that record, with its last answer.
  if (k.end) {
    std::string cause = Str(*k.end, "summary");
    if (cause.empty()) cause = fmt::format("its agent exited with code {}", Int(*k.end, "exit_code", 0));
    return {Str(*k.end, "state", "FINISHED"), cause};
  }
  if (Answering(k)) return {AgentStatus::FromJson(At(k.state, "agent")).state, ""};
  // Never answered: nothing says it was part of the job's work.
  if (k.last_seen == 0) return {"UNREACHABLE", k.error};
  // The survivors' record of the job going on without it, from when it was last seen: the
  // event that names its address, else the first one.
  const std::string addr = Str(k.record, "addr");
  const json* named = nullptr;
  const json* after = nullptr;
  for (const auto& e : survivors_history) {
    if (Dbl(e, "time") < k.last_seen - 1) continue;
    if (!named && NamesAddress(Str(e, "cause"), addr)) named = &e;
    if (!after) after = &e;
  }
  const json* why = named ? named : after;
  std::string cause;
  if (why) {
    cause = fmt::format("{} (recorded by the survivors, round {}); ", Str(*why, "cause"),
                        Int(*why, "round", -1));
  }
  cause += fmt::format("no answer from its agent for {:.0f} s: {}", now - k.last_seen, k.error);
  return {"LOST", cause};
}

json JobView::Build(double now, json* logs_out) {
  // What the nodes that answer recorded (rounds, restarts, failures), oldest first: the
  // cause of a node that does not answer.
  std::vector<json> survivors_history;
  for (const auto& [index, k] : known_) {
    if (!Answering(k)) continue;
    for (const auto& e : k.history) {
      if (Str(e, "type") != "round" || Str(e, "cause") != "start") survivors_history.push_back(e);
    }
  }
  std::stable_sort(survivors_history.begin(), survivors_history.end(),
                   [](const json& a, const json& b) { return Dbl(a, "time") < Dbl(b, "time"); });
  json nodes = json::array(), logs = json::array();
  std::map<std::string, int> count;
  int ranks_running = 0, world_size = 0;
  double samples_per_s = 0;
  for (const auto& [index, k] : known_) {
    const AgentStatus agent = AgentStatus::FromJson(At(k.state, "agent"));
    // Fields the agent has not said (it never answered, or has not joined a round) are null.
    const bool answered = At(k.state, "agent").is_object();
    auto joined = [&](auto field) { return agent.joined ? json(field(*agent.joined)) : json(); };
    const std::string addr = Str(k.record, "addr"), host = Str(k.record, "host");
    const bool running = Answering(k);
    const auto [state, cause] = StateAndCause(k, survivors_history, now);
    json ranks = RankRows(k.state);
    if (!running) {
      for (auto& r : ranks) r["state"] = state;
    }
    const json& sys = At(k.state, "system");
    json history = json::array();
    for (const auto& e : k.history) history.push_back(e);
    nodes.push_back({{"index", index},
                     {"host", host},
                     {"addr", addr},
                     {"url", Str(k.record, "url")},
                     {"pid", At(k.record, "pid")},
                     {"state", state},
                     {"reachable", running},
                     {"cause", cause},
                     {"last_seen", k.last_seen},
                     {"round", answered ? json(agent.round) : json()},
                     {"world_size", joined([](const RoundStatus& r) { return r.world_size; })},
                     {"group_rank", joined([](const RoundStatus& r) { return r.group_rank; })},
                     {"restarts", joined([](const RoundStatus& r) { return r.restarts; })},
                     {"reforms", joined([](const RoundStatus& r) { return r.reforms; })},
                     {"budget_used", joined([](const RoundStatus& r) { return r.budget_used; })},
                     {"max_restarts", answered ? json(agent.max_restarts) : json()},
                     {"cpu_percent", running ? At(At(sys, "node"), "cpu_percent") : json()},
                     {"gpus", GpuSummary(At(sys, "gpus"))},
                     {"ranks", ranks},
                     {"events", history}});
    ++count[running                ? "running"
            : state == "LOST"      ? "lost"
            : state == "UNREACHABLE" ? "unreachable"
            : state == "SUCCEEDED" ? "finished"
                                   : "failed"];
    if (running) {
      ranks_running += static_cast<int>(ranks.size());
      for (const auto& r : ranks) {
        if (r["samples_per_s"].is_number()) samples_per_s += r["samples_per_s"].get<double>();
      }
      world_size = std::max(world_size, agent.joined ? agent.joined->world_size : 0);
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
    if (!Str(At(k.state, "agent"), "run_id").empty()) run_id = Str(At(k.state, "agent"), "run_id");
  }
  json summary = {{"nodes", known_.size()}, {"ranks", ranks_running},
                  {"samples_per_s", samples_per_s}, {"world_size", world_size}};
  for (const char* bucket : {"running", "lost", "unreachable", "finished", "failed"}) {
    summary[bucket] = count[bucket];
  }
  return {{"time", now}, {"run_id", run_id}, {"summary", summary}, {"nodes", nodes},
          {"directory_error", directory_error_}};
}

}  // namespace cohort::metrics
