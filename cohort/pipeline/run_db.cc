// RunDb on SQLite (see run_db.h). Thread-safety: one instance per thread.
#include "cohort/pipeline/run_db.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cohort/launch/sql_db.h"

namespace cohort::pipeline {

namespace {

constexpr std::pair<RunState, std::string_view> kRunStates[] = {
    {RunState::kRunning, "running"},
    {RunState::kSucceeded, "succeeded"},
    {RunState::kFailed, "failed"},
    {RunState::kCancelled, "cancelled"}};
constexpr std::pair<StepState, std::string_view> kStepStates[] = {
    {StepState::kPending, "pending"},     {StepState::kRunning, "running"},
    {StepState::kSucceeded, "succeeded"}, {StepState::kFailed, "failed"},
    {StepState::kCached, "cached"},       {StepState::kSkipped, "skipped"},
    {StepState::kNotRun, "not-run"},      {StepState::kCancelled, "cancelled"}};

template <typename State, size_t N>
std::string_view NameIn(const std::pair<State, std::string_view> (&table)[N], State state) {
  for (const auto& [s, name] : table) {
    if (s == state) return name;
  }
  return "unknown";
}

template <typename State, size_t N>
std::optional<State> ParseIn(const std::pair<State, std::string_view> (&table)[N],
                             std::string_view name) {
  for (const auto& [s, n] : table) {
    if (n == name) return s;
  }
  return std::nullopt;
}

}  // namespace

std::string_view StateName(RunState state) { return NameIn(kRunStates, state); }
std::string_view StateName(StepState state) { return NameIn(kStepStates, state); }
std::optional<RunState> ParseRunState(std::string_view name) { return ParseIn(kRunStates, name); }
std::optional<StepState> ParseStepState(std::string_view name) {
  return ParseIn(kStepStates, name);
}

bool IsDone(StepState state) {
  return state == StepState::kSucceeded || state == StepState::kCached ||
         state == StepState::kSkipped;
}

bool IsFinal(StepState state) {
  return IsDone(state) || state == StepState::kFailed || state == StepState::kNotRun ||
         state == StepState::kCancelled;
}
namespace {

using json = nlohmann::json;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  pipeline TEXT NOT NULL,
  spec_path TEXT NOT NULL,
  spec_yaml TEXT NOT NULL,
  base_dir TEXT NOT NULL,
  params_json TEXT NOT NULL,
  state TEXT NOT NULL,
  exit_code INTEGER,
  started_at REAL NOT NULL DEFAULT 0,
  ended_at REAL NOT NULL DEFAULT 0,
  detail TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS steps (
  run_id INTEGER NOT NULL REFERENCES runs(id),
  name TEXT NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  exit_code INTEGER,
  started_at REAL NOT NULL DEFAULT 0,
  ended_at REAL NOT NULL DEFAULT 0,
  outputs_json TEXT NOT NULL DEFAULT '{}',
  cache_key TEXT NOT NULL DEFAULT '',
  log_dir TEXT NOT NULL DEFAULT '',
  detail TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (run_id, name)
);
CREATE INDEX IF NOT EXISTS steps_by_cache_key ON steps(cache_key);
)sql";

constexpr const char* kWhat = "pipeline database";

// A statement on the pipeline database.
class Stmt : public launch::SqlStatement {
 public:
  Stmt(sqlite3* db, const char* sql) : SqlStatement(db, sql, kWhat) {}
};

std::map<std::string, std::string> JsonToMap(const std::string& text) {
  std::map<std::string, std::string> out;
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.value().is_string()) out[it.key()] = it.value().get<std::string>();
  }
  return out;
}
std::string MapToJson(const std::map<std::string, std::string>& m) { return json(m).dump(); }

constexpr const char* kRunColumns =
    "id, pipeline, spec_path, spec_yaml, base_dir, params_json, state, exit_code, started_at, "
    "ended_at, detail";

RunRecord ReadRun(const launch::SqlStatement& s) {
  RunRecord r;
  r.id = s.Int("id");
  r.pipeline = s.Text("pipeline");
  r.spec_path = s.Text("spec_path");
  r.spec_yaml = s.Text("spec_yaml");
  r.base_dir = s.Text("base_dir");
  r.params = JsonToMap(s.Text("params_json"));
  r.state = ParseRunState(s.Text("state")).value_or(RunState::kFailed);
  r.exit_code = s.OptInt("exit_code");
  r.started_at = s.Real("started_at");
  r.ended_at = s.Real("ended_at");
  r.detail = s.Text("detail");
  return r;
}

constexpr const char* kStepColumns =
    "name, state, attempts, exit_code, started_at, ended_at, outputs_json, cache_key, log_dir, "
    "detail";

StepRecord ReadStep(const launch::SqlStatement& s) {
  StepRecord r;
  r.name = s.Text("name");
  r.state = ParseStepState(s.Text("state")).value_or(StepState::kFailed);
  r.attempts = static_cast<int>(s.Int("attempts"));
  r.exit_code = s.OptInt("exit_code");
  r.started_at = s.Real("started_at");
  r.ended_at = s.Real("ended_at");
  r.outputs = JsonToMap(s.Text("outputs_json"));
  r.cache_key = s.Text("cache_key");
  r.log_dir = s.Text("log_dir");
  r.detail = s.Text("detail");
  return r;
}

}  // namespace

std::string RunDbPath(const std::string& home) { return home + "/pipelines.db"; }
std::string RunLogDir(const std::string& home, int64_t run_id) {
  return home + "/pipelines/" + std::to_string(run_id);
}

Result<std::unique_ptr<RunDb>> RunDb::Open(const std::string& path) {
  COHORT_ASSIGN_OR_RETURN(sqlite3* db, launch::OpenSqlDatabase(path, kSchema, kWhat));
  return std::unique_ptr<RunDb>(new RunDb(db));
}

Result<std::unique_ptr<RunDb>> RunDb::OpenReadOnly(const std::string& path) {
  COHORT_ASSIGN_OR_RETURN(sqlite3* db, launch::OpenSqlDatabaseReadOnly(path, kWhat));
  return std::unique_ptr<RunDb>(new RunDb(db));
}

RunDb::~RunDb() { sqlite3_close(db_); }

Result<int64_t> RunDb::InsertRun(const RunRecord& r) {
  Stmt s(db_,
         "INSERT INTO runs (pipeline, spec_path, spec_yaml, base_dir, params_json, state, "
         "exit_code, started_at, ended_at, detail) VALUES (?,?,?,?,?,?,?,?,?,?)");
  s.Bind(1, r.pipeline).Bind(2, r.spec_path).Bind(3, r.spec_yaml).Bind(4, r.base_dir);
  s.Bind(5, MapToJson(r.params)).Bind(6, std::string(StateName(r.state))).Bind(7, r.exit_code).Bind(8, r.started_at);
  s.Bind(9, r.ended_at).Bind(10, r.detail);
  COHORT_RETURN_IF_ERROR(s.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

Status RunDb::UpdateRun(const RunRecord& r) {
  Stmt s(db_,
         "UPDATE runs SET state=?, exit_code=?, started_at=?, ended_at=?, detail=?, "
         "params_json=? WHERE id=?");
  s.Bind(1, std::string(StateName(r.state))).Bind(2, r.exit_code).Bind(3, r.started_at).Bind(4, r.ended_at);
  s.Bind(5, r.detail).Bind(6, MapToJson(r.params)).Bind(7, r.id);
  return s.Run();
}

Result<RunRecord> RunDb::GetRun(int64_t id) {
  std::string sql = fmt::format("SELECT {} FROM runs WHERE id=?", kRunColumns);
  Stmt s(db_, sql.c_str());
  s.Bind(1, id);
  return s.FirstRow(ReadRun, NotFound("no pipeline run {}", id));
}

Result<std::vector<RunRecord>> RunDb::ListRuns(int limit) {
  std::string sql = fmt::format("SELECT {} FROM runs ORDER BY id DESC LIMIT ?", kRunColumns);
  Stmt s(db_, sql.c_str());
  s.Bind(1, static_cast<int64_t>(limit));
  return s.Rows(ReadRun);
}

Status RunDb::PutStep(int64_t run_id, const StepRecord& r) {  // keeps the row (and its order)
  Stmt s(db_,
         "INSERT INTO steps (run_id, name, state, attempts, exit_code, started_at, ended_at, "
         "outputs_json, cache_key, log_dir, detail) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
         "ON CONFLICT(run_id, name) DO UPDATE SET state=excluded.state, "
         "attempts=excluded.attempts, exit_code=excluded.exit_code, "
         "started_at=excluded.started_at, ended_at=excluded.ended_at, "
         "outputs_json=excluded.outputs_json, cache_key=excluded.cache_key, "
         "log_dir=excluded.log_dir, detail=excluded.detail");
  s.Bind(1, run_id).Bind(2, r.name).Bind(3, std::string(StateName(r.state))).Bind(4, static_cast<int64_t>(r.attempts));
  s.Bind(5, r.exit_code).Bind(6, r.started_at).Bind(7, r.ended_at);
  s.Bind(8, MapToJson(r.outputs)).Bind(9, r.cache_key).Bind(10, r.log_dir).Bind(11, r.detail);
  return s.Run();
}

Result<std::vector<StepRecord>> RunDb::Steps(int64_t run_id) {
  std::string sql =
      fmt::format("SELECT {} FROM steps WHERE run_id=? ORDER BY rowid", kStepColumns);
  Stmt s(db_, sql.c_str());
  s.Bind(1, run_id);
  return s.Rows(ReadStep);
}

Result<std::optional<StepRecord>> RunDb::FindCached(const std::string& pipeline,
                                                    const std::string& step,
                                                    const std::string& cache_key) {
  std::string sql = fmt::format(
      "SELECT {} FROM steps JOIN runs ON runs.id = steps.run_id WHERE runs.pipeline=? AND "
      "steps.name=? AND steps.cache_key=? AND steps.state IN ('succeeded', 'cached') "
      "ORDER BY steps.ended_at DESC LIMIT 1",
      "steps.name, steps.state, steps.attempts, steps.exit_code, steps.started_at, "
      "steps.ended_at, steps.outputs_json, steps.cache_key, steps.log_dir, steps.detail");
  Stmt s(db_, sql.c_str());
  COHORT_RETURN_IF_ERROR(s.ok());
  s.Bind(1, pipeline).Bind(2, step).Bind(3, cache_key);
  if (s.Step() != SQLITE_ROW) return std::optional<StepRecord>();
  return std::optional<StepRecord>(ReadStep(s));
}

}  // namespace cohort::pipeline
