// SubmitJob (see submit.h). Thread-safety: as documented there.
#include "cohort/launch/submit.h"

#include <filesystem>
#include <map>

#include "cohort/base/time.h"

namespace cohort::launch {

Result<JobRecord> SubmitJob(JobDb& db, Backend& backend, const JobSpec& spec,
                            const std::vector<ArrayElement>& elements, const std::string& home,
                            const ChildOf* parent) {
  JobRecord job;
  if (parent) {
    job.parent_id = parent->parent_id;
    job.target = parent->target;
  }
  job.name = spec.name;
  job.backend = backend.name();
  job.spec_yaml = JobSpecToYaml(spec);
  job.submitted_at = WallSeconds();
  job.array_size = static_cast<int>(elements.size());
  job.concurrency = spec.array.concurrency;
  COHORT_ASSIGN_OR_RETURN(job.id, db.Insert(job));
  job.log_dir =
      std::filesystem::absolute(std::filesystem::path(home) / "logs" / std::to_string(job.id))
          .string();
  std::error_code ec;
  std::filesystem::create_directories(job.log_dir, ec);
  Status recorded = db.Update(job).status();
  auto backend_id = recorded.ok() ? backend.Submit(job, spec, elements)
                                  : Result<std::string>(recorded);
  if (!backend_id.ok()) {
    job.state = JobState::kFailed;
    job.ended_at = WallSeconds();
    job.detail = "not submitted: " + backend_id.status().message();
    (void)db.Update(job);
    for (int i = 0; i < job.array_size; ++i) {  // each element failed, for the same reason
      ElementRecord e;
      e.index = i;
      e.state = JobState::kFailed;
      e.ended_at = job.ended_at;
      e.detail = job.detail;
      (void)db.UpdateElement(job.id, e);
    }
    return Status(backend_id.status().code(),
                  fmt::format("the {} backend refused job {}: {}", job.backend, job.id,
                              backend_id.status().message()));
  }
  // Only the backend's id: the runner may already have recorded the job's progress or end,
  // which a full-row write from here would undo.
  COHORT_RETURN_IF_ERROR(db.SetBackendId(job.id, *backend_id));
  COHORT_ASSIGN_OR_RETURN(job, db.Get(job.id));
  return job;
}

bool NeverSubmitted(const JobRecord& job) {
  return job.backend_id.empty() && IsFinalState(job.state);
}

Result<JobStatus> RefreshJob(JobDb& db, Backend& backend, JobRecord& job) {
  if (NeverSubmitted(job)) {
    JobStatus s{job.state, job.exit_code, job.detail, {}};
    COHORT_ASSIGN_OR_RETURN(s.elements, db.Elements(job.id));
    return s;
  }
  COHORT_ASSIGN_OR_RETURN(JobStatus s, backend.Poll(job));
  // An element's final state, once recorded, stands (the engine may since have forgotten
  // it: a finished object deleted by its TTL reads as deleted).
  if (!backend.RecordsOwnState() && !s.elements.empty()) {
    Result<std::vector<ElementRecord>> recorded = db.Elements(job.id);
    std::map<int, ElementRecord> final_by_index;  // (a history that cannot be read: none)
    if (recorded.ok()) {
      for (ElementRecord& r : *recorded) {
        if (IsFinalState(r.state)) final_by_index[r.index] = std::move(r);
      }
    }
    bool kept = false;
    for (ElementRecord& e : s.elements) {
      auto it = final_by_index.find(e.index);
      if (it != final_by_index.end() && it->second.state != e.state) {
        e = it->second;
        kept = true;
      }
    }
    if (kept && !IsFinalState(job.state)) s.state = AggregateElementStates(s.elements);
  }
  if (s.state == job.state && s.exit_code == job.exit_code && s.detail == job.detail) return s;
  job.state = s.state;
  job.exit_code = s.exit_code;
  job.detail = s.detail;
  // A backend that records its own progress (the local runner) is not overwritten; what it
  // derives on reading ("lost") is shown, not stored.
  if (backend.RecordsOwnState()) return s;
  // The engine's own times are not asked for: the first poll that sees the job move sets
  // them (a job seen first when it already ended starts and ends then).
  if (s.state != JobState::kPending && job.started_at == 0) job.started_at = WallSeconds();
  if (IsFinalState(s.state) && job.ended_at == 0) job.ended_at = WallSeconds();
  COHORT_RETURN_IF_ERROR(db.Update(job).status());
  for (const auto& e : s.elements) COHORT_RETURN_IF_ERROR(db.UpdateElement(job.id, e).status());
  return s;
}

}  // namespace cohort::launch
