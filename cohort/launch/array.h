// Job arrays: one job spec fanned out over elements, each with its own environment.
// Elements come from a range ("0-99", "0-98:2"), a CSV manifest (one element per row; the
// header names environment variables), or the rows of a SQL query against SQLite or
// PostgreSQL (the columns name the variables). Every element also gets COHORT_ARRAY_INDEX
// (its position, 0-based) and COHORT_ARRAY_SIZE.
//
// Thread-safety: pure functions (the SQL source opens its own connection per call).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch {

struct ArrayElement {
  int index = 0;                              // 0-based position in the array
  std::map<std::string, std::string> env;     // includes COHORT_ARRAY_INDEX
};

// Expands `array` (relative manifest paths resolve against `base_dir`). Problems name the
// field ("array.manifest", "array.from_sql") and, for CSV, the line. An empty source gives
// no elements (not an array job). `notes` (optional) gets what the user should know but
// is no problem (a manifest's header row skipped although array.columns names them).
std::vector<ArrayElement> ExpandArray(const ArraySource& array, const std::string& base_dir,
                                      std::vector<Problem>* problems,
                                      std::vector<std::string>* notes = nullptr);

// Parses "0-99", "0-99:2" or "7" into indices; nullopt-like empty result plus a problem.
std::vector<int> ParseArrayRange(const std::string& text, std::string* error);

}  // namespace cohort::launch
