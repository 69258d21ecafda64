// Backend factory (see backend.h). Thread-safety: pure function.
#include "cohort/launch/backend.h"

#include "cohort/launch/kubernetes_backend.h"
#include "cohort/launch/local_backend.h"
#include "cohort/launch/slurm_backend.h"
#include "cohort/launch/targets.h"

namespace cohort::launch {

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& name,
                                             const BackendOptions& options) {
  if (name == "local") return MakeLocalBackend(options);
  if (name == "slurm") return MakeSlurmBackend(options);
  if (name == "kubernetes" || name == "k8s") return MakeKubernetesBackend(options);
  if (name == kTargetsBackend) return MakeTargetsBackend(options);
  return InvalidArgument("unknown backend '{}' (local, slurm, kubernetes)", name);
}

Result<std::unique_ptr<Backend>> MakeBackendForJob(const JobRecord& job,
                                                   const BackendOptions& options) {
  if (job.target.empty()) return MakeBackend(job.backend, options);
  COHORT_ASSIGN_OR_RETURN(TargetRecordValue where, ParseTargetRecord(job.target));
  return MakeBackend(job.backend, TargetOptions(options, where.target));
}

}  // namespace cohort::launch
