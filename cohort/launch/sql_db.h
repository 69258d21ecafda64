// Small SQLite helpers shared by the job history (JobDb) and the pipeline run state (RunDb):
// opening a database file that several processes share, and prepared statements that are
// finalized on scope exit. Error messages name the database (`what`: "job database").
//
// Thread-safety: a connection and its statements belong to one thread.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cohort/base/check.h"
#include "cohort/base/status.h"

namespace cohort::launch {

// Opens an existing database for reading only (no schema written, no migration): for
// readers that must never change a history (`cohort ui`). kNotFound when it does not exist.
Result<sqlite3*> OpenSqlDatabaseReadOnly(const std::string& path, const std::string& what);
// Opens (creating the file and its directory) `path` for use by several processes: a busy
// timeout for their locks, WAL journal, then `schema` (CREATE ... IF NOT EXISTS).
Result<sqlite3*> OpenSqlDatabase(const std::string& path, const char* schema,
                                 const std::string& what);
Status ExecSql(sqlite3* db, const std::string& sql, const std::string& what);

class SqlStatement {
 public:
  SqlStatement(sqlite3* db, const char* sql, std::string what)
      : db_(db), what_(std::move(what)) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~SqlStatement() { sqlite3_finalize(stmt_); }
  SqlStatement(const SqlStatement&) = delete;
  SqlStatement& operator=(const SqlStatement&) = delete;

  Status ok() const { return rc_ == SQLITE_OK ? Status::Ok() : Error(); }
  SqlStatement& Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  SqlStatement& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  SqlStatement& Bind(int i, double v) {
    sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  SqlStatement& Bind(int i, const std::optional<int>& v) {
    if (v) {
      sqlite3_bind_int64(stmt_, i, *v);
    } else {
      sqlite3_bind_null(stmt_, i);
    }
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return sqlite3_step(stmt_); }
  // Runs a statement that returns no rows (or ignores them).
  Status Run() {
    if (rc_ != SQLITE_OK) return Error();
    int rc = Step();
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? Status::Ok() : Error();
  }
  Status Error() const { return Internal("{}: {}", what_, sqlite3_errmsg(db_)); }

  // Every row of the (bound) statement, each made by `read(*this)`; the error of a failed
  // prepare or step.
  template <typename Read>
  auto Rows(Read read) -> Result<std::vector<decltype(read(*this))>> {
    COHORT_RETURN_IF_ERROR(ok());
    std::vector<decltype(read(*this))> out;
    int rc;
    while ((rc = Step()) == SQLITE_ROW) out.push_back(read(*this));
    if (rc != SQLITE_DONE) return Error();
    return out;
  }
  // The first row, made by `read(*this)`; `missing` when there is none.
  template <typename Read>
  auto FirstRow(Read read, Status missing) -> Result<decltype(read(*this))> {
    COHORT_RETURN_IF_ERROR(ok());
    int rc = Step();
    if (rc == SQLITE_ROW) return read(*this);
    if (rc == SQLITE_DONE) return missing;
    return Error();
  }

  std::string Text(int c) const {
    const unsigned char* t = sqlite3_column_text(stmt_, c);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  int64_t Int(int c) const { return sqlite3_column_int64(stmt_, c); }
  double Real(int c) const { return sqlite3_column_double(stmt_, c); }
  std::optional<int> OptInt(int c) const {
    if (sqlite3_column_type(stmt_, c) == SQLITE_NULL) return std::nullopt;
    return static_cast<int>(sqlite3_column_int64(stmt_, c));
  }
  // The same by the column's name in the result ("state"), so that readers do not number
  // columns by hand. A name the query does not return is a bug (checked).
  std::string Text(const char* name) const { return Text(Column(name)); }
  int64_t Int(const char* name) const { return Int(Column(name)); }
  double Real(const char* name) const { return Real(Column(name)); }
  std::optional<int> OptInt(const char* name) const { return OptInt(Column(name)); }
  int Column(const char* name) const {
    for (int c = 0; c < sqlite3_column_count(stmt_); ++c) {
      if (std::strcmp(sqlite3_column_name(stmt_, c), name) == 0) return c;
    }
    COHORT_CHECK(false) << what_ << ": the query returns no column '" << name << "'";
    return -1;
  }

 private:
  sqlite3* db_;
  std::string what_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

}  // namespace cohort::launch
