// Runs a companion program installed next to the cohort binary: cohort-bench (links
// libcohort) and cohort-jobs (job specs, backends, pipelines: SQLite, PostgreSQL, YAML),
// so the launcher itself stays small. Thread-safety: call from main only.
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

// <dir of /proc/self/exe>/<program>: a companion binary installed next to this one.
std::string SiblingPath(const std::string& program);

// Replaces this process with SiblingPath(program) args...; returns an exit code only when
// that fails.
int ExecSibling(const std::string& program, const std::vector<std::string>& args);

}  // namespace cohort::cli
