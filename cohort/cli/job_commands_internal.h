// What the job commands share: job_commands.cc (submit, _run-local-job) and
// job_view_commands.cc (status, list, logs, cancel): the flags every one takes, the job
// history, a job as JSON, and waiting for a job's end.
// Thread-safety: main thread only.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "cohort/base/status.h"
#include "cohort/cli/exec_sibling.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/local_backend.h"

namespace cohort::cli {

// --home and --json, which every job command takes.
struct JobCommandFlags {
  std::string home = launch::DefaultCohortHome();
  bool json = false;
  void Add(CLI::App& app) {
    app.add_option("--home", home,
                   "job history and local logs (default $COHORT_HOME or ~/.cohort)");
    app.add_flag("--json", json, "print JSON");
  }
  launch::BackendOptions Options() const {
    launch::BackendOptions o;
    o.home = home;
    o.cohort_bin = SiblingPath("cohort");
    return o;
  }
};

inline Result<std::unique_ptr<launch::JobDb>> OpenJobDb(const JobCommandFlags& c) {
  return launch::JobDb::Open(launch::JobDbPath(c.home));
}

// A job as `--json` prints it: the record, and with `s` its elements.
nlohmann::json JobJson(const launch::JobRecord& j, const launch::JobStatus* s);

// Polls until the job reaches a final state; prints each new state once, then the status
// (neither when `quiet`). Returns kExitOk when it succeeded, kExitJobCancelled when it was
// cancelled, kExitWorkerFailed otherwise, kExitBackend when its state cannot be read.
int WaitForEnd(launch::JobDb& db, launch::JobRecord& job, const launch::BackendOptions& options,
               bool quiet);

}  // namespace cohort::cli
