// JobView: the whole job on one page. Given the job's directory of agent endpoints (see
// cohort/agent/job_directory.h), it asks every running agent for its /api/state (in
// parallel, each ask bounded by fetch_timeout and the whole poll by 4 x fetch_timeout; an
// agent that has not answered for 10 s is asked every 10 s only; an agent that recorded
// its end is not asked again), remembers
// what each said last, and merges it into one JSON document:
// per node its state, round, restarts with their causes, CPU/RSS/GPU, and one row per rank
// (state, step, loss, samples/s, communication wait and bytes, CPU, RSS); the job's totals;
// and the recent log lines of every rank. A node that stops answering is not dropped: with
// an end record it is shown as finished (or failed, with its summary); without one as LOST,
// with the cause the survivors recorded when the job re-formed without it (or, when they
// recorded none, since when and why it does not answer); one never reached is UNREACHABLE
// with the reason (e.g. an endpoint on loopback seen from another host). Answers of any
// shape are tolerated (a field of the wrong type is read as absent). Served by the agent
// at /api/job and drawn by its /job page and `cohort top`.
//
// Thread-safety: Snapshot() may be called from any thread. One caller at a time polls the
// agents (polling_), without holding mu_; the others meanwhile get the previous snapshot
// (the very first ones wait for it). mu_ guards everything the poll merges into.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/base/status.h"
#include "cohort/base/time.h"

namespace cohort::metrics {

// One entry of the job's directory.
struct EndpointEntry {
  int index = 0;                       // 1-based, in publishing order
  nlohmann::json record;               // {"url", "host", "addr", "pid", "started"}
  std::optional<nlohmann::json> end;   // {"state", "exit_code", "summary", "time"}
};

struct JobViewOptions {
  // Reads the directory (from the job's store); called once per snapshot.
  std::function<Result<std::vector<EndpointEntry>>()> list;
  Duration fetch_timeout = std::chrono::milliseconds(1500);  // per agent
  Duration reuse = std::chrono::milliseconds(400);
  size_t log_lines = 200;  // recent log lines in a snapshot (the last 100 of each rank kept)
};

class JobView {
 public:
  explicit JobView(JobViewOptions options) : o_(std::move(options)) {}
  // The job now; "logs" holds the last log_lines lines of every rank, or of `rank` only
  // (>= 0), so that a quiet rank's lines can be read beside noisy ones.
  nlohmann::json Snapshot(int rank = -1) COHORT_EXCLUDES(mu_);

 private:
  struct Known {
    nlohmann::json record;
    std::optional<nlohmann::json> end;
    nlohmann::json state;       // the last /api/state answer, events removed
    double last_seen = 0;       // unix seconds of the last answer (0: never)
    double failing_since = 0;   // unix seconds of the first failed ask in a row (0: none)
    std::optional<Deadline> retry_at;  // not asked before (backing off)
    uint64_t since = 0;         // the highest event seq received
    std::string error = "not asked yet";  // why the last ask failed ("" when it answered)
    std::map<int, std::deque<nlohmann::json>> logs;  // per rank: {"time","rank","line"}
    std::deque<nlohmann::json> history;  // rounds, restarts, failures
  };
  static void Absorb(Known& k, Result<nlohmann::json> answer, double now);
  // Running: its last ask was answered and it recorded no end.
  static bool Answering(const Known& k) { return k.error.empty() && !k.end; }
  // Reads the directory, asks the agents, rebuilds last_ and last_logs_ (polling_ set by
  // the caller; mu_ taken only to read and merge).
  void Poll() COHORT_EXCLUDES(mu_);
  static std::pair<std::string, std::string> StateAndCause(
      const Known& k, const std::vector<nlohmann::json>& survivors_history, double now);
  // The snapshot without its logs; every node's kept lines, oldest first, into `logs`.
  nlohmann::json Build(double now, nlohmann::json* logs) COHORT_REQUIRES(mu_);

  const JobViewOptions o_;
  Mutex mu_;
  CondVar polled_;  // a poll ended (the first snapshot's waiters)
  bool polling_ COHORT_GUARDED_BY(mu_) = false;
  std::map<int, Known> known_ COHORT_GUARDED_BY(mu_);  // by directory index
  std::string directory_error_ COHORT_GUARDED_BY(mu_);
  nlohmann::json last_ COHORT_GUARDED_BY(mu_);
  nlohmann::json last_logs_ COHORT_GUARDED_BY(mu_);
  std::optional<Deadline> fresh_until_ COHORT_GUARDED_BY(mu_);
};

// GET `url` (http://host:port/path) within `timeout`, parsed as JSON. Any other URL is an
// InvalidArgument error (never an exception).
Result<nlohmann::json> FetchJson(const std::string& url, Duration timeout);

// One rank's row from an agent's /api/state: its state, step, loss, samples/s, comm wait
// fraction, comm bytes/seconds/operations, CPU % and RSS (absent values are null).
nlohmann::json RankRows(const nlohmann::json& state);

}  // namespace cohort::metrics
