// Kubernetes backend: renders a JobSpec as Kubernetes manifests in one of three flavors and
// drives them with kubectl.
//
//   pytorchjob  Kubeflow PyTorchJob (kubeflow.org/v1) with an elasticPolicy, Worker replicas
//   volcano     Volcano Job (batch.volcano.sh/v1alpha1): gang scheduling, svc + env plugins
//   indexed     batch/v1 Job (completionMode: Indexed) + headless Service (needs no operator)
//
// Every pod runs one `cohort run` agent (torchrun's flags) that starts nproc_per_node workers;
// the agents meet through cohort's store on the first pod (c10d) or through etcd (the given
// endpoints, or a one-member etcd rendered with the job). Single-node arrays become one Indexed
// Job whose pods load their element's environment from a ConfigMap; multi-node arrays become
// one object per element. docs/kubernetes.md has the field-by-field mapping.
//
// Submit pipes the manifests to `kubectl apply -f -`; Poll reads `kubectl get -o json`
// (kubernetes_status.cc maps it to states); Cancel runs `kubectl delete`; logs stay in the
// cluster (`kubectl logs`).
//
// Thread-safety: the free functions are pure apart from the random job token and run id they
// draw; a backend object is used by one thread at a time (see Backend).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/launch/array.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch {

// kubectl resources (fully qualified) of the job objects of each flavor.
inline constexpr const char* kPyTorchResource = "pytorchjobs.kubeflow.org";
inline constexpr const char* kVolcanoResource = "jobs.batch.volcano.sh";
inline constexpr const char* kBatchResource = "jobs.batch";

// The flavors RenderKubernetes knows.
inline constexpr const char* kKubernetesFlavors[] = {"pytorchjob", "volcano", "indexed"};

// Appends every reason `spec` (with `elements`, empty when not an array) cannot run on
// Kubernetes as `flavor`: no image, names that are not DNS labels or make host names longer
// than 63 characters, unknown flavor, a numeric priority, array variables that are not
// environment variable names, concurrency on a multi-node array, and so on.
void CheckKubernetesSpec(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                         const std::string& flavor, std::vector<Problem>* problems);

// The manifests as JSON objects, in the order they are applied (Secret, ConfigMap, Services,
// etcd, then the job objects). InvalidArgument listing CheckKubernetesSpec's problems when
// there are any. `cohort_bin` is the cohort binary inside the image ("cohort").
Result<std::vector<nlohmann::ordered_json>> RenderKubernetesObjects(
    const JobSpec& spec, const std::vector<ArrayElement>& elements, const std::string& flavor,
    const std::string& cohort_bin);

// Objects as one multi-document YAML stream ("---" before each document). Strings a YAML 1.1
// reader (kubectl's) could take for another type ("on", "007", "") are double-quoted.
Result<std::string> KubernetesYaml(const std::vector<nlohmann::ordered_json>& objects);

// RenderKubernetesObjects as YAML.
Result<std::string> RenderKubernetes(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                                     const std::string& flavor, const std::string& cohort_bin);

// kubectl resource (fully qualified) of the job objects: "pytorchjobs.kubeflow.org",
// "jobs.batch.volcano.sh" or "jobs.batch" (also for single-node arrays of any flavor).
std::string KubernetesResource(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                               const std::string& flavor);

// Maps the job objects of `resource` (a `kubectl get -o json` List of the objects labelled
// cohort.dev/job=<name>) and their pods (the same for pods; may be empty) to a JobStatus.
// `array_size` 0: not an array; elements are then left empty.
Result<JobStatus> KubernetesStatusFromJson(const std::string& resource,
                                           const std::string& objects_json,
                                           const std::string& pods_json, int array_size);

std::unique_ptr<Backend> MakeKubernetesBackend(const BackendOptions& options);

}  // namespace cohort::launch
