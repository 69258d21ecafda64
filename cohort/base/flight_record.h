// The flight record a libcohort worker dumps (the last operations of its communicator) and
// the agent reads after a failure: one format, written and read here, shared by comm (which
// records) and the agent (which reports which rank did not enter the next collective).
//
// A dump is a header line "cohort flight recorder, rank R: last N operation(s)", a column
// line, and one line per operation, oldest first; a file may hold several dumps (a timeout,
// then SIGUSR1), appended.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {

struct FlightRecordEntry {
  uint64_t seq = 0;
  std::string op;      // "allreduce"
  std::string dtype;   // "float32"
  std::string redop;   // "sum", "-"
  uint64_t count = 0;
  int root = -1;
  std::string state;   // issued | started | completed | failed
  double start = 0;    // wall seconds (issue time until it starts)
  double ms = 0;       // duration so far
  std::string error;
};

// <dir>/rank<R>.txt
std::string FlightRecordPath(const std::string& dir, int rank);

// One dump of rank `rank`'s entries (oldest first).
std::string FormatFlightRecord(int rank, const std::vector<FlightRecordEntry>& entries);

// The newest operation of the newest dump in `text` (a dump file's contents); nullopt when
// it holds none.
std::optional<FlightRecordEntry> LastFlightRecordEntry(std::string_view text);

}  // namespace cohort
