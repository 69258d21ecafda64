// Finds and runs cohort's companion programs: cohort-bench (links libcohort) and cohort-jobs
// (job specs, backends, pipelines: SQLite, PostgreSQL, YAML), so the launcher itself stays
// small, and the warm interpreter's files. In the build tree they lie beside the binary;
// installed (cmake --install, the Debian package) the internal ones are under
// <libexecdir>/cohort and `cohort` under <bindir>: found relative to the running binary,
// never by a build-tree path. Thread-safety: call from main only.
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

// A companion of this binary: <dir of /proc/self/exe>/<program> when it exists (the build
// tree), else the same name in the installed layout's other directory (libexec/cohort from
// bin, bin from libexec/cohort); the first path when none exists.
std::string SiblingPath(const std::string& program);

// Replaces this process with SiblingPath(program) args...; returns an exit code only when
// that fails.
int ExecSibling(const std::string& program, const std::vector<std::string>& args);

}  // namespace cohort::cli
