// SQLite helpers (see sql_db.h). Thread-safety: one connection per thread.
#include "cohort/launch/sql_db.h"

#include <filesystem>

#include "cohort/base/backoff.h"

namespace cohort::launch {

Status ExecSql(sqlite3* db, const std::string& sql, const std::string& what) {
  char* err = nullptr;
  if (const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err); rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    // Locked by another process past the busy timeout (or where SQLite does not wait).
    if ((rc & 0xff) == SQLITE_BUSY) return Unavailable("{}: {}", what, msg);
    return Internal("{}: {}", what, msg);
  }
  return Status::Ok();
}

Result<sqlite3*> OpenSqlDatabaseReadOnly(const std::string& path, const std::string& what) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return NotFound("no {} at {}", what, path);
    return Unavailable("cannot open the {} {} for reading: {}", what, path, msg);
  }
  sqlite3_busy_timeout(db, 10000);
  return db;
}

Result<sqlite3*> OpenSqlDatabase(const std::string& path, const char* schema,
                                 const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Unavailable("cannot open the {} {}: {} (set COHORT_HOME to a writable directory)",
                       what, path, msg);
  }
  // Several processes share the file (submit, the local runner, status): wait for locks.
  sqlite3_busy_timeout(db, 10000);
  // Switching a new file to WAL takes an exclusive lock, and SQLite answers "database is
  // locked" at once, without its busy wait, to the others that open it at the same moment
  // (20 submits into a fresh COHORT_HOME): those try again, within the same 10 s.
  Backoff again(std::chrono::milliseconds(10), std::chrono::milliseconds(200),
                Deadline::AfterMs(10000));
  for (const char* sql : {"PRAGMA journal_mode=WAL", schema}) {
    Status st = ExecSql(db, sql, what + " " + path);
    while (st.code() == StatusCode::kUnavailable && again.Sleep()) {
      st = ExecSql(db, sql, what + " " + path);
    }
    if (!st.ok()) {
      sqlite3_close(db);
      return st;
    }
  }
  return db;
}

}  // namespace cohort::launch
