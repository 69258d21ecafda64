// Runs a companion program installed next to the cohort binary (e.g. cohort-bench, which
// links libcohort; the launcher itself never does). Thread-safety: call from main only.
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

// Replaces this process with <dir of /proc/self/exe>/<program> args...; returns an exit code
// only when that fails.
int ExecSibling(const std::string& program, const std::vector<std::string>& args);

}  // namespace cohort::cli
