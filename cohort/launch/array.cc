// Job array expansion: ranges, CSV manifests (libcsv), SQL queries (SQLite, libpq).
// Thread-safety: pure functions; each SQL query opens and closes its own connection.
#include "cohort/launch/array.h"

#include <csv.h>
#include <libpq-fe.h>
#include <sqlite3.h>

#include <filesystem>
#include <regex>

#include "cohort/base/file.h"
#include "cohort/base/strings.h"
#include "cohort/launch/job_env.h"
#include "cohort/launch/spec_walker.h"

namespace cohort::launch {
namespace {


// A table: column names and rows of values, from a CSV file or a query.
struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};

// Checks that the column names can be environment variables.
void CheckColumns(const Table& t, const std::string& where, std::vector<Problem>* problems) {
  for (const auto& c : t.columns) {
    if (!IsEnvName(c)) {
      problems->push_back({where, fmt::format("column '{}' cannot be an environment variable "
                                              "name (use letters, digits and '_'; rename it, "
                                              "e.g. with AS in SQL)",
                                              c)});
    }
  }
}

// ---- CSV (RFC 4180 via libcsv) ----

struct CsvState {
  std::vector<std::string> record;
  std::vector<std::vector<std::string>> records;
};

void OnField(void* data, size_t len, void* user) {
  static_cast<CsvState*>(user)->record.emplace_back(static_cast<const char*>(data), len);
}

void OnRecord(int, void* user) {
  auto* s = static_cast<CsvState*>(user);
  s->records.push_back(std::move(s->record));
  s->record.clear();
}

// `columns` empty: the first row is the header naming the variables; otherwise every row
// is an element and `columns` names its values, except a first row that is `columns`
// itself (a header after all: skipped, with a note).
bool ReadCsv(const std::string& path, const std::string& where,
             const std::vector<std::string>& columns, Table* table,
             std::vector<Problem>* problems, std::vector<std::string>* notes) {
  auto read = ReadFileToString(path);
  if (!read.ok()) {
    problems->push_back({where, read.status().message()});
    return false;
  }
  const std::string& text = *read;
  csv_parser parser;
  if (csv_init(&parser, CSV_STRICT | CSV_APPEND_NULL | CSV_EMPTY_IS_NULL) != 0) {
    problems->push_back({where, "cannot initialize the CSV parser"});
    return false;
  }
  CsvState state;
  size_t done = csv_parse(&parser, text.data(), text.size(), OnField, OnRecord, &state);
  bool ok = done == text.size() && csv_fini(&parser, OnField, OnRecord, &state) == 0;
  if (!ok) {
    // Line of the failure: records completed so far + 1 (quoted newlines are rare here).
    problems->push_back({fmt::format("{} ({} line {})", where, path, state.records.size() + 1),
                         fmt::format("malformed CSV: {}", csv_strerror(csv_error(&parser)))});
  }
  csv_free(&parser);
  if (!ok) return false;
  // Drop blank lines (libcsv reports no record for them) and trailing empty records.
  if (state.records.empty()) {
    problems->push_back({where, fmt::format("{} is empty (it needs a header row naming the "
                                            "environment variables, then one row per element)",
                                            path)});
    return false;
  }
  const bool header = columns.empty();
  table->columns = header ? state.records[0] : columns;
  for (auto& c : table->columns) c = std::string(Trim(c));
  if (header) {
    for (const auto& c : table->columns) {
      if (IsEnvName(c)) continue;
      std::string first;
      for (const auto& v : state.records[0]) first += (first.empty() ? "" : ", ") + v;
      problems->push_back(
          {fmt::format("{} ({} line 1)", where, path),
           fmt::format("'{}' is not a header of variable names ('{}' cannot be one). If the "
                       "manifest has no header row, name its {} columns with "
                       "--array-manifest-columns NAME,NAME,... (array.columns in the spec)",
                       first, c, state.records[0].size())});
      return false;
    }
  }
  size_t first_row = header ? 1 : 0;
  if (!header) {
    std::vector<std::string> row0;
    for (const auto& v : state.records[0]) row0.emplace_back(Trim(v));
    if (row0 == table->columns) {
      first_row = 1;
      if (notes) {
        notes->push_back(fmt::format("{}: the first row of {} names the columns of "
                                     "array.columns ({}): taken as a header row, not an "
                                     "element",
                                     where, path, fmt::join(row0, ",")));
      }
    }
  }
  for (size_t i = first_row; i < state.records.size(); ++i) {
    auto& row = state.records[i];
    if (row.size() != table->columns.size()) {
      problems->push_back(
          {fmt::format("{} ({} line {})", where, path, i + 1),
           fmt::format("{} values, but {} {} columns", row.size(),
                       header ? "the header names" : "array.columns names",
                       table->columns.size())});
      continue;
    }
    for (auto& v : row) v = std::string(Trim(v));
    table->rows.push_back(std::move(row));
  }
  return true;
}

// ---- SQL ----

bool QuerySqlite(const std::string& file, const std::string& sql, Table* table,
                 std::vector<Problem>* problems) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    problems->push_back({"array.db", fmt::format("cannot open SQLite database {}: {}", file,
                                                 db ? sqlite3_errmsg(db) : "out of memory")});
    sqlite3_close(db);
    return false;
  }
  sqlite3_busy_timeout(db, 5000);
  sqlite3_stmt* stmt = nullptr;
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()), &stmt, &tail);
  bool ok = true;
  if (rc != SQLITE_OK) {
    int offset = sqlite3_error_offset(db);
    std::string where = offset >= 0 ? fmt::format("array.from_sql (character {})", offset + 1)
                                    : std::string("array.from_sql");
    problems->push_back({where, fmt::format("SQLite rejected the query: {}", sqlite3_errmsg(db))});
    ok = false;
  } else if (stmt == nullptr) {
    problems->push_back({"array.from_sql", "the query is empty"});
    ok = false;
  } else if (!sqlite3_stmt_readonly(stmt)) {
    problems->push_back({"array.from_sql", "must be a SELECT (the query may not change data)"});
    ok = false;
  } else if (tail != nullptr && std::string_view(tail).find_first_not_of(" \t\r\n;") !=
                                    std::string_view::npos) {
    problems->push_back({"array.from_sql", "must be a single statement"});
    ok = false;
  }
  if (ok) {
    for (int c = 0; c < sqlite3_column_count(stmt); ++c) {
      table->columns.push_back(sqlite3_column_name(stmt, c));
    }
    while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(stmt); ++c) {
        const unsigned char* v = sqlite3_column_text(stmt, c);
        row.push_back(v ? reinterpret_cast<const char*>(v) : "");
      }
      table->rows.push_back(std::move(row));
    }
    if (rc != SQLITE_DONE) {
      problems->push_back({"array.from_sql", fmt::format("the query failed: {}", sqlite3_errmsg(db))});
      ok = false;
    }
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return ok;
}

bool QueryPostgres(const std::string& url, const std::string& sql, Table* table,
                   std::vector<Problem>* problems) {
  // libpq takes the URL as is; a connect timeout bounds an unreachable server.
  std::string conninfo = url + (url.find('?') == std::string::npos ? "?" : "&") +
                         "connect_timeout=10";
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(conn);
    problems->push_back({"array.db", fmt::format("cannot connect to PostgreSQL: {}",
                                                 std::string(Trim(msg)))});
    PQfinish(conn);
    return false;
  }
  // Read-only, and bounded: a query cannot change data or run forever.
  PGresult* setup = PQexec(conn, "BEGIN READ ONLY; SET LOCAL statement_timeout = '60s'");
  PQclear(setup);
  PGresult* res = PQexecParams(conn, sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0);
  bool ok = true;
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    const char* pos = PQresultErrorField(res, PG_DIAG_STATEMENT_POSITION);
    const char* primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    std::string where = pos ? fmt::format("array.from_sql (character {})", pos)
                            : std::string("array.from_sql");
    std::string what = PQresultStatus(res) == PGRES_COMMAND_OK
                           ? std::string("must be a SELECT that returns rows")
                           : fmt::format("PostgreSQL rejected the query: {}",
                                         primary ? primary : PQerrorMessage(conn));
    problems->push_back({where, what});
    ok = false;
  } else {
    for (int c = 0; c < PQnfields(res); ++c) table->columns.push_back(PQfname(res, c));
    for (int r = 0; r < PQntuples(res); ++r) {
      std::vector<std::string> row;
      for (int c = 0; c < PQnfields(res); ++c) row.push_back(PQgetvalue(res, r, c));
      table->rows.push_back(std::move(row));
    }
  }
  PQclear(res);
  PGresult* end = PQexec(conn, "ROLLBACK");
  PQclear(end);
  PQfinish(conn);
  return ok;
}

bool Query(const std::string& db, const std::string& sql, Table* table,
           std::vector<Problem>* problems) {
  if (db.rfind("sqlite://", 0) == 0) {
    std::string path = db.substr(std::string("sqlite://").size());
    if (path.empty()) {
      problems->push_back({"array.db", "sqlite:// needs a path (sqlite:///abs/path.db)"});
      return false;
    }
    return QuerySqlite(path, sql, table, problems);
  }
  if (db.rfind("postgresql://", 0) == 0 || db.rfind("postgres://", 0) == 0) {
    return QueryPostgres(db, sql, table, problems);
  }
  problems->push_back({"array.db", fmt::format("'{}' is not sqlite:///path or postgresql://...",
                                               db)});
  return false;
}

std::vector<ArrayElement> FromTable(const Table& t) {
  std::vector<ArrayElement> out;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    ArrayElement e;
    e.index = static_cast<int>(i);
    for (size_t c = 0; c < t.columns.size(); ++c) e.env[t.columns[c]] = t.rows[i][c];
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

std::vector<int> ParseArrayRange(const std::string& text, std::string* error) {
  std::vector<int> out;
  auto step_parts = Split(text, ':', false);
  auto bounds = Split(step_parts[0], '-', false);
  auto lo = ParseInt64(std::string(Trim(bounds[0])));
  auto hi = bounds.size() == 2 ? ParseInt64(std::string(Trim(bounds[1]))) : lo;
  auto step = step_parts.size() == 2 ? ParseInt64(step_parts[1]) : std::optional<int64_t>(1);
  if (step_parts.size() > 2 || bounds.size() > 2 || !lo || !hi || !step) {
    *error = fmt::format("'{}' is not a range such as 0-99, 0-98:2 or 7", text);
    return {};
  }
  if (*lo < 0 || *hi < *lo || *step < 1) {
    *error = fmt::format("'{}' needs 0 <= FIRST <= LAST and a step >= 1", text);
    return {};
  }
  if ((*hi - *lo) / *step + 1 > 1000000) {
    *error = fmt::format("'{}' has more than 1,000,000 elements", text);
    return {};
  }
  for (int64_t i = *lo; i <= *hi; i += *step) out.push_back(static_cast<int>(i));
  return out;
}

std::vector<ArrayElement> ExpandArray(const ArraySource& array, const std::string& base_dir,
                                      std::vector<Problem>* problems,
                                      std::vector<std::string>* notes) {
  std::vector<ArrayElement> elements;
  const size_t before = problems->size();
  if (!array.range.empty()) {
    std::string error;
    auto indices = ParseArrayRange(array.range, &error);
    if (!error.empty()) {
      problems->push_back({"array.range", error});
      return {};
    }
    for (size_t i = 0; i < indices.size(); ++i) {
      ArrayElement e;
      e.index = static_cast<int>(i);
      e.env[kEnvArrayTaskId] = std::to_string(indices[i]);  // the value from the range
      elements.push_back(std::move(e));
    }
  } else if (!array.manifest.empty()) {
    std::filesystem::path p(array.manifest);
    if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
    Table t;
    if (!ReadCsv(p.string(), "array.manifest", array.columns, &t, problems, notes)) return {};
    CheckColumns(t, "array.manifest", problems);
    elements = FromTable(t);
  } else if (!array.from_sql.empty()) {
    Table t;
    if (!Query(array.db, array.from_sql, &t, problems)) return {};
    CheckColumns(t, "array.from_sql", problems);
    elements = FromTable(t);
  } else {
    return {};
  }
  if (problems->size() > before) return {};
  if (elements.empty()) {
    problems->push_back({!array.from_sql.empty() ? "array.from_sql" : "array.manifest",
                         "gives no elements (the array would be empty)"});
    return {};
  }
  const std::string size = std::to_string(elements.size());
  for (auto& e : elements) {
    e.env[kEnvArrayIndex] = std::to_string(e.index);
    e.env[kEnvArraySize] = size;
  }
  return elements;
}

}  // namespace cohort::launch
