// Worker-side export of DefaultRegistry(): when the worker environment names a metrics directory (worker_env.h), a thread
// ("metrics-export") writes every second
//   <dir>/rank<RANK>.json   the latest snapshot (replaced atomically: the agent serves it)
//   <dir>/rank<RANK>.jsonl  a history line {"time", "rank", "metrics"} every
//                           $COHORT_METRICS_HISTORY_S seconds (default 5)
// Monitoring never fails the job: write errors are logged once and the exporter goes on.
// Agent-side, ReadRankSnapshots() collects the latest snapshot of every local rank.
//
// Thread-safety: StartWorkerExporter/StopWorkerExporter may be called from any thread
// (idempotent); the export thread is the only writer of the files.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/metrics/registry.h"

namespace cohort::metrics {

// Starts the export thread if COHORT_METRICS_DIR is set (no-op otherwise); returns whether
// it runs.
bool StartWorkerExporter(std::chrono::milliseconds interval = std::chrono::seconds(1));
// Writes a final snapshot and stops the thread (call before exit; also run at exit).
void StopWorkerExporter();
// The worker's rank changed (live reconfiguration): later snapshots are rank<rank>.json and
// say so; the file of the old rank is removed. No-op without a running exporter.
void SetExportedRank(int rank);

struct RankSnapshot {
  int rank = -1;
  double time = 0;            // unix seconds of the snapshot
  nlohmann::json metrics;     // Registry::ToJson() form
};
// The latest snapshot of each rank<R>.json in `dir`, ordered by rank (unreadable or
// half-written files are skipped).
std::vector<RankSnapshot> ReadRankSnapshots(const std::string& dir);
// The history lines of rank<R>.jsonl in `dir` from the last `max_bytes` of each file, per
// rank (oldest first).
std::vector<std::vector<RankSnapshot>> ReadRankHistories(const std::string& dir,
                                                         size_t max_bytes);
// The lines of one rank<R>.jsonl (its last `max_bytes`), oldest first.
std::vector<RankSnapshot> ReadRankHistory(const std::string& path, size_t max_bytes);

// The value of the metric `name` in a snapshot's metrics (Registry::ToJson()), when it is a
// number.
std::optional<double> MetricValue(const nlohmann::json& metrics, std::string_view name);

}  // namespace cohort::metrics
