// JobDb: the job history in SQLite ($COHORT_HOME/jobs.db): every submitted job with its
// spec, backend, state, exit code, times and log paths, and one row per array element.
// It outlives the commands that write it: `cohort status` after a restart of the shell (or
// of the machine) shows what ran. Writers use transactions; SQLite's locking (WAL mode,
// busy timeout) lets the submitting command, the local runner and readers share the file.
//
// States (JobState): pending, running, succeeded, failed, cancelled, lost (the local runner
// vanished without recording an end). A row's state only moves forward (pending -> running
// -> a final state; a final state never changes): every update is a compare-and-set in SQL,
// so a writer holding an older copy of the row (the submitting command, a status poll) can
// never undo what the runner recorded. States are enums in code and their names ("pending")
// in the database, the CLI's output and its JSON; StateName and ParseJobState convert.
//
// Thread-safety: one JobDb per thread (each opens its own connection).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/status.h"

struct sqlite3;

namespace cohort::launch {

enum class JobState {
  kPending,
  kRunning,
  kSucceeded,
  kFailed,
  kCancelled,
  kLost,     // the engine lost it: the local runner vanished without recording an end,
             // Slurm forgot a job that left no exit code
  kUnknown,  // not known (yet): an element the engine has not reported, a state that could
             // not be read; never stored
};

// "pending", "running", ...: the names stored, printed and in JSON. ParseJobState gives
// nullopt for a name that is none of them.
std::string_view StateName(JobState state);
std::optional<JobState> ParseJobState(std::string_view name);

// JSON holds a state's name, as the database does (nlohmann's to_json hook, found by ADL).
template <typename BasicJson>
void to_json(BasicJson& j, JobState state) {
  j = StateName(state);
}

struct ElementRecord {
  int index = -1;                 // -1: the job itself (not an array)
  JobState state = JobState::kPending;
  std::optional<int> exit_code;
  double started_at = 0, ended_at = 0;  // unix seconds, 0 = not yet
  std::string log_dir;
  std::string detail;             // why it failed, from the backend
  std::string target;             // arrays over targets: the element's target (not stored)
};

struct JobRecord {
  int64_t id = 0;
  std::string name;
  std::string backend;
  std::string spec_yaml;
  JobState state = JobState::kPending;
  std::optional<int> exit_code;
  double submitted_at = 0, started_at = 0, ended_at = 0;
  std::string log_dir;
  std::string backend_id;         // pid of the local runner, Slurm job id, k8s object
  int array_size = 0;             // 0: not an array
  int concurrency = 0;
  std::string detail;
  // Arrays over several targets: the parent job (backend "targets") has one child job per
  // target; a child names its parent and holds its target as JSON (targets.h).
  int64_t parent_id = 0;
  std::string target;
};

struct JobStatus {
  JobState state = JobState::kUnknown;
  std::optional<int> exit_code;
  std::string detail;
  std::vector<ElementRecord> elements;  // empty for a job without elements
};

// succeeded, failed, cancelled, lost: the state never changes again.
bool IsFinalState(JobState state);

// The state of an array job from its elements': running or pending while any is not final;
// then failed if any failed, succeeded if any succeeded (elements cancelled on request are
// no failure), else cancelled.
JobState AggregateElementStates(const std::vector<ElementRecord>& elements);

// How many elements are in each state, by the states' names: "2 failed, 3 succeeded".
// Elements whose state is unknown are not counted.
std::string CountElementStates(const std::vector<ElementRecord>& elements);

class JobDb {
 public:
  // Opens (creating if needed) the database at `path`.
  static Result<std::unique_ptr<JobDb>> Open(const std::string& path);
  // Opens an existing history for reading only (the writers' calls then fail).
  static Result<std::unique_ptr<JobDb>> OpenReadOnly(const std::string& path);
  ~JobDb();

  // Inserts the job (id assigned) and `array_size` pending element rows.
  Result<int64_t> Insert(JobRecord job);
  // Writes the row (all but backend_id) when its state may move to job.state (see the file
  // comment); returns whether it was written (false: the stored state is already further
  // on, and nothing changed).
  Result<bool> Update(const JobRecord& job);
  Result<bool> UpdateElement(int64_t job_id, const ElementRecord& element);
  // Sets only the backend's id of the job (the submitting command, after the backend took it).
  Status SetBackendId(int64_t job_id, const std::string& backend_id);
  Result<JobRecord> Get(int64_t id);
  // By id ("7") or by name (the newest job with that name).
  Result<JobRecord> Find(const std::string& id_or_name);
  // Newest first; the children of array-over-targets jobs are listed by Children only.
  Result<std::vector<JobRecord>> List(int limit);
  Result<std::vector<JobRecord>> Children(int64_t parent_id);
  Result<std::vector<ElementRecord>> Elements(int64_t job_id);

 private:
  explicit JobDb(sqlite3* db) : db_(db) {}
  Status Exec(const std::string& sql);
  sqlite3* db_;
};

}  // namespace cohort::launch
