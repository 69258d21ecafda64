// Backend: where a job runs. `local` (this machine, history in SQLite), `slurm` (sbatch with
// one cohort agent per node via srun), `kubernetes` (PyTorchJob, Volcano Job or an Indexed
// Job + headless Service + etcd, applied with kubectl). The CLI (`cohort submit | status |
// logs | cancel | list`) talks to every backend through this interface and keeps the job
// history in the JobDb whatever the backend.
//
// Thread-safety: a Backend is used by one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/launch/array.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch {

struct BackendOptions {
  std::string home;        // COHORT_HOME: job database and local logs
  std::string cohort_bin;  // the cohort binary the backend starts on nodes
  std::string cohort_in_image = "cohort";  // kubernetes targets of an array: cohort in pods
  std::string kube_flavor = "pytorchjob";  // pytorchjob | volcano | indexed
  std::string kubectl = "kubectl";
  std::string kube_context;    // kubectl --context ("" : the current context)
  std::string kube_namespace;  // kubectl --namespace ("" : the context's)
  std::string slurm_cluster;   // Slurm -M / --clusters ("" : the local cluster)
  bool dry_run = false;        // only Validate and Render will be called (a preview)
  std::string workdir;         // local: the job's working directory ("" : the caller's)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Checks only this backend can make (an image for kubernetes, resources against this
  // machine or the Slurm partition); appends problems, never submits.
  virtual void Validate(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                        std::vector<Problem>* problems) = 0;

  // What Submit would hand to the engine (sbatch script, manifests), for --dry-run.
  virtual Result<std::string> Render(const JobSpec& spec,
                                     const std::vector<ArrayElement>& elements) = 0;

  // Starts the job recorded as `job` (its id and log directory are set); returns the
  // engine's id for it (a pid, a Slurm job id, a Kubernetes object name).
  virtual Result<std::string> Submit(const JobRecord& job, const JobSpec& spec,
                                     const std::vector<ArrayElement>& elements) = 0;

  // Current state of the job and of each element, from the engine.
  virtual Result<JobStatus> Poll(const JobRecord& job) = 0;

  virtual Status Cancel(const JobRecord& job) = 0;

  // Stops element `element` of the array job `job` (the others go on); it ends
  // `cancelled`. kFailedPrecondition where the engine cannot stop one element alone.
  virtual Status CancelElement(const JobRecord& job, int element) {
    (void)element;
    return FailedPrecondition("the {} backend cannot stop one element of job {}: cancel the whole "
                         "job (`cohort cancel {}`)",
                         name(), job.id, job.id);
  }

  // True when the backend writes the job's progress to the JobDb itself (the local runner);
  // callers then show what Poll returns without storing it.
  virtual bool RecordsOwnState() const { return false; }

  // Path of a log file to show for `element` (-1: the job) and `rank` (-1: all), when the
  // backend keeps logs in files on this machine; an error saying where to look otherwise.
  virtual Result<std::string> LogPath(const JobRecord& job, int element, int rank) = 0;
};

// local | slurm | kubernetes (k8s) | targets (an array over several targets, targets.h).
Result<std::unique_ptr<Backend>> MakeBackend(const std::string& name,
                                             const BackendOptions& options);

// The backend of a recorded job: MakeBackend(job.backend) aimed where the job went (a
// child of an array over targets runs on its target's context or cluster).
Result<std::unique_ptr<Backend>> MakeBackendForJob(const JobRecord& job,
                                                   const BackendOptions& options);

}  // namespace cohort::launch
