// SubmitJob: the one procedure that turns a validated job spec into a submitted job, used by
// `cohort submit` and by pipeline steps with a job spec. Thread-safety: as JobDb (one per
// thread) and Backend (one thread at a time).
#pragma once

#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/launch/array.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch {

// 1. Records `spec` in `db` as a new job of `backend` (log directory <home>/logs/<id>).
// 2. Hands it to the backend. A refusal is recorded (state failed, the reason as detail)
//    and returned as an error naming the job.
// 3. Returns the record as the backend left it (with its id for the job), re-read so that
//    a state the backend recorded meanwhile (the local runner starting) is kept.
// A child job of an array over targets (targets.h): its parent and target record.
struct ChildOf {
  int64_t parent_id = 0;
  std::string target;
};

Result<JobRecord> SubmitJob(JobDb& db, Backend& backend, const JobSpec& spec,
                            const std::vector<ArrayElement>& elements, const std::string& home,
                            const ChildOf* parent = nullptr);

// True for a job its backend refused at submit (a Kubernetes context that does not exist, a
// Slurm partition sbatch refused): it ended without a backend id, and the engine knows
// nothing of it.
bool NeverSubmitted(const JobRecord& job);

// Asks `backend` for the job's current state and records it in `db` (unless the backend
// records its own progress, as the local runner does); updates `job` and returns the status.
// A job never submitted is answered from its record (the engine is not asked).
Result<JobStatus> RefreshJob(JobDb& db, Backend& backend, JobRecord& job);

}  // namespace cohort::launch
