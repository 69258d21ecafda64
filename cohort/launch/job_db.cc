// JobDb on SQLite (see job_db.h). Thread-safety: one instance per thread.
#include "cohort/launch/job_db.h"

#include <filesystem>
#include <map>
#include <utility>

#include "cohort/base/strings.h"
#include "cohort/launch/sql_db.h"

namespace cohort::launch {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  backend TEXT NOT NULL,
  spec_yaml TEXT NOT NULL,
  state TEXT NOT NULL,
  exit_code INTEGER,
  submitted_at REAL NOT NULL,
  started_at REAL NOT NULL DEFAULT 0,
  ended_at REAL NOT NULL DEFAULT 0,
  log_dir TEXT NOT NULL DEFAULT '',
  backend_id TEXT NOT NULL DEFAULT '',
  array_size INTEGER NOT NULL DEFAULT 0,
  concurrency INTEGER NOT NULL DEFAULT 0,
  detail TEXT NOT NULL DEFAULT '',
  parent_id INTEGER NOT NULL DEFAULT 0,
  target TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS jobs_by_name ON jobs(name);
CREATE TABLE IF NOT EXISTS elements (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  idx INTEGER NOT NULL,
  state TEXT NOT NULL,
  exit_code INTEGER,
  started_at REAL NOT NULL DEFAULT 0,
  ended_at REAL NOT NULL DEFAULT 0,
  log_dir TEXT NOT NULL DEFAULT '',
  detail TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (job_id, idx)
);
)sql";

constexpr std::pair<JobState, std::string_view> kJobStates[] = {
    {JobState::kPending, "pending"},     {JobState::kRunning, "running"},
    {JobState::kSucceeded, "succeeded"}, {JobState::kFailed, "failed"},
    {JobState::kCancelled, "cancelled"}, {JobState::kLost, "lost"},
    {JobState::kUnknown, "unknown"}};

constexpr const char* kWhat = "job database";

// A statement on the job database.
class Stmt : public SqlStatement {
 public:
  Stmt(sqlite3* db, const char* sql) : SqlStatement(db, sql, kWhat) {}
};

constexpr const char* kJobColumns =
    "id, name, backend, spec_yaml, state, exit_code, submitted_at, started_at, ended_at, "
    "log_dir, backend_id, array_size, concurrency, detail, parent_id, target";

// A state the database holds; one this version does not know reads as unknown.
JobState StoredState(const SqlStatement& s) {
  return ParseJobState(s.Text("state")).value_or(JobState::kUnknown);
}

// The columns a job and an element share (JobRecord, ElementRecord): its state, outcome,
// times, logs and why it failed.
template <typename Record>
void ReadOutcome(const SqlStatement& s, Record* r) {
  r->state = StoredState(s);
  r->exit_code = s.OptInt("exit_code");
  r->started_at = s.Real("started_at");
  r->ended_at = s.Real("ended_at");
  r->log_dir = s.Text("log_dir");
  r->detail = s.Text("detail");
}

JobRecord ReadJob(const SqlStatement& s) {
  JobRecord j;
  j.id = s.Int("id");
  j.name = s.Text("name");
  j.backend = s.Text("backend");
  j.spec_yaml = s.Text("spec_yaml");
  ReadOutcome(s, &j);
  j.submitted_at = s.Real("submitted_at");
  j.backend_id = s.Text("backend_id");
  j.array_size = static_cast<int>(s.Int("array_size"));
  j.concurrency = static_cast<int>(s.Int("concurrency"));
  j.parent_id = s.Int("parent_id");
  j.target = s.Text("target");
  return j;
}

// A state's name as bound to a statement.
std::string Name(JobState state) { return std::string(StateName(state)); }

}  // namespace

std::string_view StateName(JobState state) {
  for (const auto& [s, name] : kJobStates) {
    if (s == state) return name;
  }
  return StateName(JobState::kUnknown);
}

std::optional<JobState> ParseJobState(std::string_view name) {
  for (const auto& [s, n] : kJobStates) {
    if (n == name) return s;
  }
  return std::nullopt;
}

bool IsFinalState(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled || state == JobState::kLost;
}

JobState AggregateElementStates(const std::vector<ElementRecord>& elements) {
  bool all_final = true, any_failed = false, any_started = false, any_succeeded = false;
  for (const auto& e : elements) {
    all_final = all_final && IsFinalState(e.state);
    any_failed = any_failed || e.state == JobState::kFailed || e.state == JobState::kLost;
    any_succeeded = any_succeeded || e.state == JobState::kSucceeded;
    any_started = any_started || e.state != JobState::kPending;
  }
  if (!all_final) return any_started ? JobState::kRunning : JobState::kPending;
  return any_failed ? JobState::kFailed
         : any_succeeded ? JobState::kSucceeded
                         : JobState::kCancelled;
}

std::string CountElementStates(const std::vector<ElementRecord>& elements) {
  std::map<std::string_view, int> counts;  // by name, as printed
  for (const auto& e : elements) {
    if (e.state != JobState::kUnknown) counts[StateName(e.state)]++;
  }
  std::string summary;
  for (const auto& [state, n] : counts) {
    summary += fmt::format("{}{} {}", summary.empty() ? "" : ", ", n, state);
  }
  return summary;
}

Result<std::unique_ptr<JobDb>> JobDb::Open(const std::string& path) {
  COHORT_ASSIGN_OR_RETURN(sqlite3* db, OpenSqlDatabase(path, kSchema, kWhat));
  std::unique_ptr<JobDb> out(new JobDb(db));
  // Databases written before array targets existed lack their columns.
  for (const char* column : {"parent_id INTEGER NOT NULL DEFAULT 0", "target TEXT NOT NULL DEFAULT ''"}) {
    const std::string name = std::string(column).substr(0, std::string(column).find(' '));
    Stmt probe(db, fmt::format("SELECT {} FROM jobs LIMIT 0", name).c_str());
    if (!probe.ok().ok()) COHORT_RETURN_IF_ERROR(out->Exec(fmt::format("ALTER TABLE jobs ADD COLUMN {}", column)));
  }
  return out;
}

Result<std::unique_ptr<JobDb>> JobDb::OpenReadOnly(const std::string& path) {
  COHORT_ASSIGN_OR_RETURN(sqlite3* db, OpenSqlDatabaseReadOnly(path, kWhat));
  return std::unique_ptr<JobDb>(new JobDb(db));
}

JobDb::~JobDb() { sqlite3_close(db_); }

Status JobDb::Exec(const std::string& sql) { return ExecSql(db_, sql, kWhat); }

Result<int64_t> JobDb::Insert(JobRecord job) {
  COHORT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  Stmt s(db_,
         "INSERT INTO jobs (name, backend, spec_yaml, state, exit_code, submitted_at, "
         "started_at, ended_at, log_dir, backend_id, array_size, concurrency, detail, "
         "parent_id, target) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  Status st = s.ok();
  if (st.ok()) {
    s.Bind(1, job.name).Bind(2, job.backend).Bind(3, job.spec_yaml).Bind(4, Name(job.state));
    s.Bind(5, job.exit_code).Bind(6, job.submitted_at).Bind(7, job.started_at);
    s.Bind(8, job.ended_at).Bind(9, job.log_dir).Bind(10, job.backend_id);
    s.Bind(11, static_cast<int64_t>(job.array_size)).Bind(12, static_cast<int64_t>(job.concurrency));
    s.Bind(13, job.detail).Bind(14, job.parent_id).Bind(15, job.target);
    st = s.Run();
  }
  const int64_t id = sqlite3_last_insert_rowid(db_);
  for (int i = 0; st.ok() && i < job.array_size; ++i) {
    Stmt e(db_, "INSERT INTO elements (job_id, idx, state) VALUES (?, ?, ?)");
    st = e.ok();
    if (st.ok()) {
      st = e.Bind(1, id).Bind(2, static_cast<int64_t>(i)).Bind(3, Name(JobState::kPending)).Run();
    }
  }
  if (!st.ok()) {
    (void)Exec("ROLLBACK");
    return st;
  }
  COHORT_RETURN_IF_ERROR(Exec("COMMIT"));
  return id;
}

// The compare-and-set condition of a state update, with the new state bound as ?1: the
// stored state is the same, still pending, or running and the new one is not pending.
std::string StateMayMove() {
  return fmt::format("(state = ?1 OR state = '{0}' OR (state = '{1}' AND ?1 <> '{0}'))",
                     StateName(JobState::kPending), StateName(JobState::kRunning));
}

namespace {

// Stores the outcome of a job or an element (the columns ReadOutcome reads) in the row of
// `table` that `where` picks (its parameters from ?7 on, bound by `bind_where`), unless its
// stored state may not move to the new one. Whether a row changed.
template <typename Record, typename BindWhere>
Result<bool> UpdateOutcome(sqlite3* db, const char* table, const char* where, const Record& r,
                           BindWhere bind_where) {
  Stmt s(db, fmt::format("UPDATE {} SET state=?1, exit_code=?2, started_at=?3, ended_at=?4, "
                         "log_dir=?5, detail=?6 WHERE {} AND {}",
                         table, where, StateMayMove())
                 .c_str());
  COHORT_RETURN_IF_ERROR(s.ok());
  s.Bind(1, Name(r.state)).Bind(2, r.exit_code).Bind(3, r.started_at).Bind(4, r.ended_at);
  s.Bind(5, r.log_dir).Bind(6, r.detail);
  bind_where(s);
  COHORT_RETURN_IF_ERROR(s.Run());
  return sqlite3_changes(db) > 0;
}

}  // namespace

Result<bool> JobDb::Update(const JobRecord& job) {
  return UpdateOutcome(db_, "jobs", "id=?7", job, [&](SqlStatement& s) { s.Bind(7, job.id); });
}

Result<bool> JobDb::UpdateElement(int64_t job_id, const ElementRecord& e) {
  return UpdateOutcome(db_, "elements", "job_id=?7 AND idx=?8", e, [&](SqlStatement& s) {
    s.Bind(7, job_id).Bind(8, static_cast<int64_t>(e.index));
  });
}

Status JobDb::SetBackendId(int64_t job_id, const std::string& backend_id) {
  Stmt s(db_, "UPDATE jobs SET backend_id=? WHERE id=?");
  COHORT_RETURN_IF_ERROR(s.ok());
  return s.Bind(1, backend_id).Bind(2, job_id).Run();
}

Result<JobRecord> JobDb::Get(int64_t id) {
  Stmt s(db_, fmt::format("SELECT {} FROM jobs WHERE id=?", kJobColumns).c_str());
  s.Bind(1, id);
  return s.FirstRow(ReadJob, NotFound("no job {} (see `cohort list`)", id));
}

Result<JobRecord> JobDb::Find(const std::string& id_or_name) {
  if (auto id = ParseInt64(id_or_name)) return Get(*id);
  Stmt s(db_,
         fmt::format("SELECT {} FROM jobs WHERE name=? AND parent_id = 0 ORDER BY id DESC LIMIT 1", kJobColumns)
             .c_str());
  s.Bind(1, id_or_name);
  return s.FirstRow(ReadJob,
                    NotFound("no job with id or name '{}' (see `cohort list`)", id_or_name));
}

Result<std::vector<JobRecord>> JobDb::List(int limit) {
  Stmt s(db_, fmt::format("SELECT {} FROM jobs WHERE parent_id = 0 ORDER BY id DESC LIMIT ?",
                          kJobColumns)
                  .c_str());
  s.Bind(1, static_cast<int64_t>(limit));
  return s.Rows(ReadJob);
}

Result<std::vector<JobRecord>> JobDb::Children(int64_t parent_id) {
  Stmt s(db_, fmt::format("SELECT {} FROM jobs WHERE parent_id = ? ORDER BY id", kJobColumns).c_str());
  s.Bind(1, parent_id);
  return s.Rows(ReadJob);
}

Result<std::vector<ElementRecord>> JobDb::Elements(int64_t job_id) {
  Stmt s(db_,
         "SELECT idx, state, exit_code, started_at, ended_at, log_dir, detail FROM elements "
         "WHERE job_id=? ORDER BY idx");
  s.Bind(1, job_id);
  return s.Rows([](const SqlStatement& s) {
    ElementRecord e;
    e.index = static_cast<int>(s.Int("idx"));
    ReadOutcome(s, &e);
    return e;
  });
}

}  // namespace cohort::launch
