// What kubernetes_checks.cc and kubernetes_backend.cc share: the names derived from a
// spec (objects, pods, the rendezvous endpoint, the token Secret) and the checks that run
// again before rendering. Internal to the kubernetes backend: include it from those two
// files only. Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cohort/launch/array.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch::k8s {

inline constexpr int kEtcdPort = 2379;
inline constexpr const char* kShmVolume = "cohort-shm";
inline constexpr const char* kArrayVolume = "cohort-array";

// A name a POSIX shell can export; what Kubernetes accepts as an environment variable name.
bool IsShellVariable(std::string_view s);
bool IsKubeEnvName(std::string_view s);
bool IsFlavor(const std::string& flavor);
bool SingleNodeArray(const JobSpec& spec, const std::vector<ArrayElement>& elements);
bool MultiNodeArray(const JobSpec& spec, const std::vector<ArrayElement>& elements);
bool UsesEtcd(const JobSpec& spec);
bool HasMaster(const JobSpec& spec);
bool OwnEtcd(const JobSpec& spec);
// Multi-node jobs on cohort's store need the same COHORT_TOKEN in every pod: a Secret,
// unless the spec sets the variable itself.
bool NeedsTokenSecret(const JobSpec& spec);
std::string TokenSecretName(const JobSpec& spec);
std::string ArrayConfigMapName(const JobSpec& spec);
std::string EtcdName(const JobSpec& spec);
// Name of the job object of each element (multi-node arrays) or of the job.
std::vector<std::string> ObjectNames(const JobSpec& spec,
                                     const std::vector<ArrayElement>& elements);
// Host name of pod `index` of the job object `object`.
std::string PodHostName(const std::string& flavor, const std::string& object, int index);
// The rendezvous endpoint the agents of `object` use (c10d: the first pod serves the store).
std::string RendezvousEndpoint(const JobSpec& spec, const std::string& flavor,
                               const std::string& object);

void Add(std::vector<Problem>* problems, std::string where, std::string what);
// What the spec parser checks already, repeated before rendering (a spec built in code
// cannot produce broken manifests), and the rendezvous settings pods can use.
void CheckBasics(const JobSpec& spec, std::vector<Problem>* problems);
void CheckRendezvous(const JobSpec& spec, std::vector<Problem>* problems);

}  // namespace cohort::launch::k8s
