// RunDb: pipeline runs in SQLite ($COHORT_HOME/pipelines.db): each run with its spec text,
// parameters and state; each step with its state, attempts, exit code, times, output values
// and cache key. The cache looks up earlier successful steps by (pipeline, step, cache key).
// WAL mode and a busy timeout let `cohort pipeline status` read while a run writes.
//
// Run states: running, succeeded, failed, cancelled. Step states: pending, running,
// succeeded, failed, cached, skipped (condition false), not-run (a dependency failed),
// cancelled.
//
// Thread-safety: one RunDb per thread (each opens its own connection).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/base/status.h"

struct sqlite3;

namespace cohort::pipeline {

struct RunRecord {
  int64_t id = 0;
  std::string pipeline;
  std::string spec_path;
  std::string spec_yaml;
  std::string base_dir;
  std::map<std::string, std::string> params;
  std::string state = "running";
  std::optional<int> exit_code;
  double started_at = 0, ended_at = 0;
  std::string detail;
};

struct StepRecord {
  std::string name;
  std::string state = "pending";
  int attempts = 0;
  std::optional<int> exit_code;
  double started_at = 0, ended_at = 0;
  std::map<std::string, std::string> outputs;
  std::string cache_key;
  std::string log_dir;
  std::string detail;
};

class RunDb {
 public:
  static Result<std::unique_ptr<RunDb>> Open(const std::string& path);
  ~RunDb();

  Result<int64_t> InsertRun(const RunRecord& run);
  Status UpdateRun(const RunRecord& run);
  Result<RunRecord> GetRun(int64_t id);
  Result<std::vector<RunRecord>> ListRuns(int limit);

  Status PutStep(int64_t run_id, const StepRecord& step);  // insert or replace
  Result<std::vector<StepRecord>> Steps(int64_t run_id);

  // Outputs of the newest succeeded step `step` of pipeline `pipeline` with `cache_key`.
  Result<std::optional<StepRecord>> FindCached(const std::string& pipeline,
                                               const std::string& step,
                                               const std::string& cache_key);

 private:
  explicit RunDb(sqlite3* db) : db_(db) {}
  sqlite3* db_;
};

std::string RunDbPath(const std::string& home);          // <home>/pipelines.db
std::string RunLogDir(const std::string& home, int64_t run_id);  // <home>/pipelines/<id>

}  // namespace cohort::pipeline
