// Worker-side export of DefaultRegistry(): when the agent set COHORT_METRICS_DIR, a thread
// ("metrics-export") writes every second
//   <dir>/rank<RANK>.json   the latest snapshot (replaced atomically: the agent serves it)
//   <dir>/rank<RANK>.jsonl  one line per snapshot {"time", "rank", "metrics"} (history)
// Monitoring never fails the job: write errors are logged once and the exporter goes on.
// Agent-side, ReadRankSnapshots() collects the latest snapshot of every local rank.
//
// Thread-safety: StartWorkerExporter/StopWorkerExporter may be called from any thread
// (idempotent); the export thread is the only writer of the files.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "cohort/metrics/registry.h"

namespace cohort::metrics {

// Starts the export thread if COHORT_METRICS_DIR is set (no-op otherwise); returns whether
// it runs.
bool StartWorkerExporter(std::chrono::milliseconds interval = std::chrono::seconds(1));
// Writes a final snapshot and stops the thread (call before exit; also run at exit).
void StopWorkerExporter();

struct RankSnapshot {
  int rank = -1;
  double time = 0;            // unix seconds of the snapshot
  nlohmann::json metrics;     // Registry::ToJson() form
};
// The latest snapshot of each rank<R>.json in `dir`, ordered by rank (unreadable or
// half-written files are skipped).
std::vector<RankSnapshot> ReadRankSnapshots(const std::string& dir);

}  // namespace cohort::metrics
