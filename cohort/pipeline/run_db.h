// RunDb: pipeline runs in SQLite ($COHORT_HOME/pipelines.db): each run with its spec text,
// parameters and state; each step with its state, attempts, exit code, times, output values
// and cache key. The cache looks up earlier successful steps by (pipeline, step, cache key).
// WAL mode and a busy timeout let `cohort pipeline status` read while a run writes.
//
// States are enums in code (RunState, StepState) and their names ("not-run") in the
// database, the CLI's output and its JSON; StateName and Parse*State convert.
//
// Thread-safety: one RunDb per thread (each opens its own connection).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/status.h"

struct sqlite3;

namespace cohort::pipeline {

enum class RunState { kRunning, kSucceeded, kFailed, kCancelled };

enum class StepState {
  kPending,
  kRunning,
  kSucceeded,
  kFailed,
  kCached,     // unchanged since an earlier run: its outputs are reused
  kSkipped,    // its condition was false
  kNotRun,     // a dependency failed
  kCancelled,
};

// "running", "not-run", ...; Parse*State gives nullopt for a name that is none of them.
std::string_view StateName(RunState state);
std::string_view StateName(StepState state);
std::optional<RunState> ParseRunState(std::string_view name);
std::optional<StepState> ParseStepState(std::string_view name);

// Succeeded, cached or skipped: dependents may run.
bool IsDone(StepState state);
// No further change: done, failed, not run or cancelled.
bool IsFinal(StepState state);

struct RunRecord {
  int64_t id = 0;
  std::string pipeline;
  std::string spec_path;
  std::string spec_yaml;
  std::string base_dir;
  std::map<std::string, std::string> params;
  RunState state = RunState::kRunning;
  std::optional<int> exit_code;
  double started_at = 0, ended_at = 0;
  std::string detail;
};

struct StepRecord {
  std::string name;
  StepState state = StepState::kPending;
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
  // Opens an existing run history for reading only.
  static Result<std::unique_ptr<RunDb>> OpenReadOnly(const std::string& path);
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
