// The `local` backend: the job runs on this machine under a detached runner process
// (`cohort _run-local-job`) that starts one `cohort run` per job or array element, at most
// `concurrency` at once, records every start and end in the JobDb, and on SIGTERM (cancel)
// stops its children (which stop their workers) before recording the job as cancelled; on
// SIGUSR1 it stops the elements asked for (`cohort cancel --element`) and goes on.
// The history survives the submitting command, the runner, and restarts of the machine; a
// runner that vanished without recording an end is reported as `lost`.
//
// Layout under the job's log directory ($COHORT_HOME/logs/<id>/):
//   runner.log             the runner's own messages
//   elements.json          the array elements with their environments, fixed at submit
//   cancel/<index>         a request to stop one element (`cohort cancel --element`; the
//                          runner reads them on SIGUSR1 and before starting elements)
//   job/ or <index>/       per unit: output.log (the cohort run console) and ranks/ (the
//                          per-attempt, per-rank logs of cohort run --log-dir)
//
// Thread-safety: a backend instance is used by one thread; the runner is single-threaded.
#pragma once

#include <memory>
#include <string>

#include "cohort/launch/backend.h"

namespace cohort::launch {

std::unique_ptr<Backend> MakeLocalBackend(const BackendOptions& options);

// The body of `cohort _run-local-job`: runs job `job_id` of the database under `home`.
// Returns the process exit code (0 when every unit succeeded).
int RunLocalJob(const std::string& home, int64_t job_id, const std::string& cohort_bin);

// $COHORT_HOME, else $HOME/.cohort.
std::string DefaultCohortHome();
std::string JobDbPath(const std::string& home);

}  // namespace cohort::launch
