// Backend factory (see backend.h). Thread-safety: pure function.
#include "cohort/launch/backend.h"

#include "cohort/launch/local_backend.h"
#if __has_include("cohort/launch/kubernetes_backend.cc")
#include "cohort/launch/kubernetes_backend.h"
#define COHORT_HAVE_KUBE 1
#endif
#if __has_include("cohort/launch/slurm_backend.cc")
#include "cohort/launch/slurm_backend.h"
#define COHORT_HAVE_SLURM 1
#endif

namespace cohort::launch {

Result<std::unique_ptr<Backend>> MakeBackend(const std::string& name,
                                             const BackendOptions& options) {
  if (name == "local") return MakeLocalBackend(options);
#ifdef COHORT_HAVE_SLURM
  if (name == "slurm") return MakeSlurmBackend(options);
#endif
#ifdef COHORT_HAVE_KUBE
  if (name == "kubernetes" || name == "k8s") return MakeKubernetesBackend(options);
#endif
  return InvalidArgument("unknown backend '{}' (local, slurm, kubernetes)", name);
}

}  // namespace cohort::launch
