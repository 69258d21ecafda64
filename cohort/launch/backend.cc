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

}  // namespace cohort::launch
