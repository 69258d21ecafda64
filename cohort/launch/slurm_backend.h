// The `slurm` backend: a job becomes one sbatch script whose single `srun` starts one
// `cohort run` agent per allocated node (--ntasks-per-node=1); the agents meet in the
// rendezvous store served by the agent on the first node of the allocation (or in etcd).
// A job array becomes a Slurm job array (--array=0-(N-1)%concurrency) whose script picks
// each element's environment by $SLURM_ARRAY_TASK_ID. State comes from
// `scontrol show job -o` (no slurmdbd needed), and, once Slurm has forgotten a job, from the
// exit-code file the script leaves next to its output. docs/slurm.md explains the script.
//
// Layout under the job's log directory (it must be visible on the nodes):
//   job.sbatch                  the submitted script
//   slurm-<id>.out              --output/--error of the job (arrays: slurm-<id>_<index>.out)
//   slurm-<id>.exit             the script's exit code, written when srun returns
//   job/ranks/ or <index>/ranks/  per-attempt, per-rank logs of `cohort run --log-dir`
//
// The functions below MakeSlurmBackend are the pieces the backend is made of, exposed for
// unit tests.
//
// Thread-safety: the free functions are pure; a backend instance is used by one thread.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/launch/array.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch {

// The sbatch script for `spec` (elements non-empty: a job array). `cohort_bin` is the
// cohort binary as the nodes see it; `log_dir` the job's log directory (shared with the
// nodes). Fails on values no script can carry (an invalid environment variable name, a
// non-numeric priority, a log directory with a double quote or a newline). `cluster`: the
// Slurm cluster of a multi-cluster site (#SBATCH --clusters), "" for the local one.
Result<std::string> RenderSbatch(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                                 const std::string& cohort_bin, const std::string& log_dir,
                                 const std::string& cluster = "");

std::unique_ptr<Backend> MakeSlurmBackend(const BackendOptions& options);

namespace slurm {

// One record of `scontrol show job -o`: its Key=Value fields (the first occurrence of a key
// wins; a value with spaces, such as a path, is kept whole).
using Record = std::map<std::string, std::string>;
std::vector<Record> ParseScontrolRecords(std::string_view text);

// Slurm JobState ("COMPLETED", "CANCELLED by 0", "RUNNING") -> cohort state: pending,
// running, succeeded, failed, cancelled. A state this table does not know counts as running
// (not final), so the caller keeps polling.
JobState MapJobState(std::string_view slurm_state);

// ExitCode=X:Y -> X, or 128+Y when the batch script was killed by signal Y; nullopt when
// the text is not X:Y.
std::optional<int> ParseExitCode(std::string_view text);

// ArrayTaskId ("3", "2-5%2", "0,4-6:2") -> the indices it names; empty on nonsense.
std::vector<int> ParseTaskIds(std::string_view text);

// The job's status from the records of `scontrol show job -o <id>`. For an array
// (`array_size` > 0) every element 0..array_size-1 gets a row; elements no record names are
// left with index set and state kUnknown (the caller fills them from files). The job's
// state aggregates the elements: running while any runs, else pending while any waits, else
// failed if any failed, else cancelled if any was cancelled, else succeeded.
JobStatus StatusFromRecords(const std::vector<Record>& records, int array_size);

// Aggregates element states into the job's state, exit code and detail (see above).
void AggregateElements(JobStatus* status);

// What the files of a job (or array element) Slurm no longer knows say: the exit-code file
// written by the script, else the cancel/time-out notice slurmstepd writes into the output
// file, else "lost". `tag` is "<id>" or "<id>_<index>".
ElementRecord StatusFromFiles(const std::string& log_dir, const std::string& tag);

// `sinfo -h -o "%P %D %c %m %G"` per partition: nodes summed, the largest node's CPUs,
// memory and GPUs.
struct Partition {
  std::string name;
  bool is_default = false;
  int nodes = 0;
  int max_cpus = 0;
  int64_t max_memory_mib = 0;
  int max_gpus = 0;
  std::map<std::string, int> max_gres;  // every generic resource: name -> most on one node
};
std::vector<Partition> ParseSinfo(std::string_view text);

// The Slurm gres name of a Kubernetes-style extended resource: nvidia.com/gpu -> gpu, else
// the name after the domain (aws.amazon.com/neuron -> neuron, vpc.amazonaws.com/efa -> efa).
std::string GresName(const std::string& extended_resource);

// Problems (with field paths) for what the partition the spec asks for cannot run.
void CheckAgainstPartitions(const JobSpec& spec, const std::vector<Partition>& partitions,
                            std::vector<Problem>* problems);

// Problems independent of the cluster: numeric priority, environment names, volumes.
void CheckSpec(const JobSpec& spec, std::vector<Problem>* problems);

// "<log_dir>/slurm-<id>.out" or "<log_dir>/slurm-<id>_<index>.out".
std::string OutputPath(const std::string& log_dir, const std::string& slurm_id, int element);

// A field of a record ("" when absent); an element (or job) from its record.
std::string Field(const Record& r, const std::string& key);
ElementRecord ElementFromRecord(const Record& r);
// "2026-11-29T14:56:12" (the controller's local time) -> unix seconds; 0 for Unknown/None.
double ParseSlurmTime(const std::string& text);
// --cpus-per-task and --mem (MiB) of a spec: 0 when it asks for none.
int CpusPerTask(const JobSpec& spec);
int64_t MemoryMib(const JobSpec& spec);

}  // namespace slurm
}  // namespace cohort::launch
