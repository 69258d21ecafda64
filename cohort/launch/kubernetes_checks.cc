// The checks of the kubernetes backend (CheckKubernetesSpec) and the names derived from a
// spec (kubernetes_internal.h). Thread-safety: pure functions.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/launch/kubernetes_backend.h"
#include "cohort/launch/kubernetes_internal.h"
#include "cohort/launch/spec_walker.h"

namespace cohort::launch {
namespace k8s {
namespace {

constexpr size_t kConfigMapLimit = 1000 * 1000;  // the API server refuses more than 1 MiB
constexpr int kMaxIndexedCompletions = 100000;   // batch/v1 limit for Indexed Jobs
constexpr int kMaxProblemsPerKind = 5;  // e.g. bad variable names reported per array

}  // namespace

// ---------------------------------------------------------------------------------------
// Names

// A name a POSIX shell can export: [A-Za-z_][A-Za-z0-9_]*.
bool IsShellVariable(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// What Kubernetes accepts as a container environment variable name.
bool IsKubeEnvName(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

bool IsFlavor(const std::string& flavor) {
  return std::find(std::begin(kKubernetesFlavors), std::end(kKubernetesFlavors), flavor) !=
         std::end(kKubernetesFlavors);
}

bool SingleNodeArray(const JobSpec& spec, const std::vector<ArrayElement>& elements) {
  return !elements.empty() && spec.max_nodes == 1;
}

bool MultiNodeArray(const JobSpec& spec, const std::vector<ArrayElement>& elements) {
  return !elements.empty() && spec.max_nodes > 1;
}

bool UsesEtcd(const JobSpec& spec) { return spec.rdzv.backend == "etcd"; }
bool HasMaster(const JobSpec& spec) { return spec.kubernetes.master.value_or(false); }
bool OwnEtcd(const JobSpec& spec) { return UsesEtcd(spec) && spec.rdzv.endpoint.empty(); }

// Multi-node jobs on cohort's store need the same COHORT_TOKEN in every pod: a Secret made
// here, unless the spec sets the variable itself.
bool NeedsTokenSecret(const JobSpec& spec) {
  return spec.max_nodes > 1 && !UsesEtcd(spec) && spec.env.count(worker_env::kToken) == 0;
}

std::string TokenSecretName(const JobSpec& spec) { return spec.name + "-token"; }
std::string ArrayConfigMapName(const JobSpec& spec) { return spec.name + "-array"; }
std::string EtcdName(const JobSpec& spec) { return spec.name + "-etcd"; }

// Name of the job object of each element (multi-node arrays) or of the job.
std::vector<std::string> ObjectNames(const JobSpec& spec,
                                     const std::vector<ArrayElement>& elements) {
  if (!MultiNodeArray(spec, elements)) return {spec.name};
  std::vector<std::string> names;
  names.reserve(elements.size());
  for (const auto& e : elements) names.push_back(fmt::format("{}-{}", spec.name, e.index));
  return names;
}

// Host name of pod `index` of the job object `object`.
std::string PodHostName(const std::string& flavor, const std::string& object, int index) {
  if (flavor == "indexed") return fmt::format("{}-{}", object, index);
  return fmt::format("{}-worker-{}", object, index);  // PyTorchJob and Volcano pods
}

// The rendezvous endpoint the agents of `object` use (c10d: the first pod serves the store).
std::string RendezvousEndpoint(const JobSpec& spec, const std::string& flavor,
                               const std::string& object) {
  if (UsesEtcd(spec)) {
    return spec.rdzv.endpoint.empty() ? fmt::format("{}:{}", EtcdName(spec), kEtcdPort)
                                      : spec.rdzv.endpoint;
  }
  if (!spec.rdzv.endpoint.empty()) return spec.rdzv.endpoint;
  if (spec.max_nodes == 1) return "";  // the agent serves its own store on loopback
  if (flavor == "pytorchjob") {
    // The training operator gives every replica a headless Service named after its pod;
    // with a Master replica, its pod serves the store.
    const std::string host = HasMaster(spec) ? object + "-master-0" : PodHostName(flavor, object, 0);
    return fmt::format("{}:{}", host, spec.rdzv.port);
  }
  // Volcano's svc plugin and our own Service: <host>.<service named after the object>.
  return fmt::format("{}.{}:{}", PodHostName(flavor, object, 0), object, spec.rdzv.port);
}


// ---------------------------------------------------------------------------------------
// Checks

void Add(std::vector<Problem>* problems, std::string where, std::string what) {
  problems->push_back({std::move(where), std::move(what)});
}

void CheckNames(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                const std::string& flavor, std::vector<Problem>* problems) {
  if (spec.name.empty()) {
    Add(problems, "name", "required: the name of the Kubernetes objects (e.g. fmnist)");
    return;
  }
  if (!IsDnsLabel(spec.name)) {
    Add(problems, "name",
        fmt::format("'{}' is not a DNS-1123 label: use lowercase letters, digits and '-', "
                    "starting and ending with a letter or digit, at most 63 characters",
                    spec.name));
    return;
  }
  if (!(spec.name[0] >= 'a' && spec.name[0] <= 'z')) {
    Add(problems, "name",
        fmt::format("'{}' must start with a letter on Kubernetes (it names the job's Services)",
                    spec.name));
    return;
  }
  // The longest name derived from the job name must still be a DNS label.
  const bool single_array = SingleNodeArray(spec, elements);
  std::string longest = spec.name;
  auto consider = [&](std::string candidate) {
    if (candidate.size() > longest.size()) longest = std::move(candidate);
  };
  if (single_array) {
    consider(PodHostName("indexed", spec.name, static_cast<int>(elements.size()) - 1));
  } else if (IsFlavor(flavor)) {
    for (const auto& object : ObjectNames(spec, elements)) {
      consider(PodHostName(flavor, object, spec.max_nodes - 1));
    }
  }
  if (OwnEtcd(spec)) consider(EtcdName(spec));
  if (longest.size() > 63) {
    Add(problems, "name",
        fmt::format("'{}' is too long for Kubernetes: the derived name '{}' has {} characters "
                    "(at most 63); shorten the name by {} characters",
                    spec.name, longest, longest.size(), longest.size() - 63));
  }
}

// Volume names become Kubernetes volume names; claims name PersistentVolumeClaims.
void CheckVolumeNames(const JobSpec& spec, std::vector<Problem>* problems) {
  for (size_t i = 0; i < spec.volumes.size(); ++i) {
    const Volume& v = spec.volumes[i];
    const std::string where = fmt::format("volumes[{}]", i);
    if (!IsDnsLabel(v.name)) {
      Add(problems, where + ".name",
          fmt::format("'{}' is not a DNS-1123 label (lowercase letters, digits and '-', "
                      "starting and ending with a letter or digit), as Kubernetes volume names "
                      "must be",
                      v.name));
    } else if (v.name == kShmVolume || v.name == kArrayVolume) {
      Add(problems, where + ".name",
          fmt::format("'{}' is reserved by the kubernetes backend; choose another name", v.name));
    }
    if (!v.claim.empty() && !IsDnsSubdomain(v.claim)) {
      Add(problems, where + ".claim",
          fmt::format("'{}' is not a PersistentVolumeClaim name (a DNS-1123 subdomain)", v.claim));
    }
  }
}

// What the spec parser checks already; repeated before rendering so that a spec built in
// code cannot produce broken manifests.
void CheckBasics(const JobSpec& spec, std::vector<Problem>* problems) {
  if (spec.entrypoint.empty()) {
    Add(problems, "entrypoint", "required (the program every worker runs)");
  }
  if (spec.min_nodes < 1 || spec.max_nodes < spec.min_nodes) {
    Add(problems, "nnodes",
        fmt::format("{}:{} is not MIN:MAX with 1 <= MIN <= MAX", spec.min_nodes, spec.max_nodes));
  }
  if (spec.nproc_per_node < 1) {
    Add(problems, "nproc_per_node", fmt::format("{} must be at least 1", spec.nproc_per_node));
  }
  if (spec.max_restarts < 0) {
    Add(problems, "max_restarts", fmt::format("{} must be 0 or more", spec.max_restarts));
  }
  for (const auto& [key, value] : spec.env) {
    if (!IsKubeEnvName(key)) {
      Add(problems, "env." + key, "is not an environment variable name");
    }
  }
  std::set<std::string> names;
  for (size_t i = 0; i < spec.volumes.size(); ++i) {
    const Volume& v = spec.volumes[i];
    names.insert(v.name);
    if (v.host_path.empty() && v.claim.empty() && (v.nfs_server.empty() || v.nfs_path.empty())) {
      Add(problems, fmt::format("volumes[{}]", i), "needs one of host_path, claim or nfs");
    }
  }
  for (size_t i = 0; i < spec.mounts.size(); ++i) {
    const Mount& m = spec.mounts[i];
    if (names.count(m.volume) == 0) {
      Add(problems, fmt::format("mounts[{}].volume", i),
          fmt::format("no volume named '{}' in volumes", m.volume));
    }
    if (m.path.empty() || m.path[0] != '/') {
      Add(problems, fmt::format("mounts[{}].path", i),
          fmt::format("'{}' must be an absolute path in the container", m.path));
    }
  }
}

void CheckRendezvous(const JobSpec& spec, std::vector<Problem>* problems) {
  if (spec.rdzv.backend != "c10d" && spec.rdzv.backend != "etcd") {
    Add(problems, "rdzv.backend",
        fmt::format("'{}' is not supported: use c10d (cohort's store on the first pod) or etcd",
                    spec.rdzv.backend));
  }
  if (spec.rdzv.port < 1 || spec.rdzv.port > 65535) {
    Add(problems, "rdzv.port", fmt::format("{} is not a TCP port (1-65535)", spec.rdzv.port));
  }
  if (spec.rdzv.endpoint.empty()) return;
  if (UsesEtcd(spec)) {
    for (const auto& item : Split(spec.rdzv.endpoint, ',')) {
      std::string_view hp = Trim(item);
      if (StartsWith(hp, "http://")) hp.remove_prefix(7);
      if (StartsWith(hp, "https://")) hp.remove_prefix(8);
      if (!ParseHostPort(hp, kEtcdPort)) {
        Add(problems, "rdzv.endpoint",
            fmt::format("'{}' is not host:port (etcd members: h1:2379,h2:2379,...)", item));
      }
    }
  } else if (!ParseHostPort(spec.rdzv.endpoint, spec.rdzv.port)) {
    Add(problems, "rdzv.endpoint",
        fmt::format("'{}' is not host:port of a cohort store", spec.rdzv.endpoint));
  }
}

void CheckArray(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                std::vector<Problem>* problems) {
  if (elements.empty()) return;
  const bool single = SingleNodeArray(spec, elements);
  std::set<std::string> bad;
  size_t configmap_bytes = 0;
  for (size_t i = 0; i < elements.size(); ++i) {
    const ArrayElement& e = elements[i];
    if (e.index != static_cast<int>(i)) {
      Add(problems, "array",
          fmt::format("element {} has index {}: elements must be numbered 0, 1, 2, ... in order", i,
                      e.index));
      return;
    }
    for (const auto& [key, value] : e.env) {
      const bool ok = single ? IsShellVariable(key) : IsKubeEnvName(key);
      if (!ok && bad.insert(key).second && bad.size() <= kMaxProblemsPerKind) {
        Add(problems, "array",
            fmt::format("'{}' (a column or variable of the elements) is not an environment "
                        "variable name: use letters, digits and '_', not starting with a digit",
                        key));
      }
      configmap_bytes += key.size() + value.size() + 12;  // export KEY='value'\n
    }
  }
  if (single && elements.size() > static_cast<size_t>(kMaxIndexedCompletions)) {
    Add(problems, "array",
        fmt::format("{} elements: an Indexed Job holds at most {}; split the array",
                    elements.size(), kMaxIndexedCompletions));
  }
  if (single && configmap_bytes > kConfigMapLimit) {
    Add(problems, "array",
        fmt::format("the elements' variables take about {} bytes, more than a ConfigMap holds "
                    "(1 MiB); pass fewer or shorter columns (e.g. an id the program looks up)",
                    configmap_bytes));
  }
  const int n = static_cast<int>(elements.size());
  if (!single && spec.array.concurrency > 0 && spec.array.concurrency < n) {
    Add(problems, "array.concurrency",
        fmt::format("the kubernetes backend runs a multi-node array as one job object per "
                    "element, all submitted at once, and Kubernetes cannot cap how many run "
                    "({} of {} requested); remove concurrency or make the job single-node",
                    spec.array.concurrency, n));
  }
}


}  // namespace k8s

using namespace k8s;  // NOLINT: this file's own helpers

void CheckKubernetesSpec(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                         const std::string& flavor, std::vector<Problem>* problems) {
  if (!IsFlavor(flavor)) {
    Add(problems, "kubernetes flavor",
        fmt::format("'{}' is not one of pytorchjob, volcano, indexed", flavor));
  }
  if (spec.image.empty()) {
    Add(problems, "image",
        "required by the kubernetes backend (the container image with cohort and your program)");
  }
  CheckNames(spec, elements, flavor, problems);
  CheckVolumeNames(spec, problems);
  if (!spec.priority.empty()) {
    if (ParseInt64(spec.priority)) {
      Add(problems, "priority",
          fmt::format("'{}' is a number (a Slurm nice value); the kubernetes backend needs the "
                      "name of a PriorityClass (e.g. high-priority)",
                      spec.priority));
    } else if (!IsDnsSubdomain(spec.priority)) {
      Add(problems, "priority",
          fmt::format("'{}' is not a PriorityClass name (a DNS-1123 subdomain)", spec.priority));
    }
  }
  if (!spec.queue.empty() && !IsDnsLabel(spec.queue)) {
    Add(problems, "queue",
        fmt::format("'{}' is not a queue name Kubernetes accepts (a DNS-1123 label: lowercase "
                    "letters, digits and '-')",
                    spec.queue));
  }
  CheckArray(spec, elements, problems);
  const KubernetesSpec& k = spec.kubernetes;
  if (k.master && flavor != "pytorchjob") {
    Add(problems, "kubernetes.master",
        fmt::format("only the pytorchjob flavor has a Master replica (this is {})", flavor));
  }
  if (HasMaster(spec) && spec.min_nodes != spec.max_nodes) {
    Add(problems, "kubernetes.master",
        fmt::format("a PyTorchJob with a Master has a fixed size; nnodes '{}' is elastic (give "
                    "nnodes N, or drop master to run elastic Workers)",
                    spec.NnodesText()));
  }
  if (!k.clean_pod_policy.empty() && flavor != "pytorchjob") {
    Add(problems, "kubernetes.clean_pod_policy",
        fmt::format("only the pytorchjob flavor has a clean-pod policy (this is {}); use "
                    "ttl_seconds_after_finished",
                    flavor));
  }
  if (spec.metrics.port == 0) {
    Add(problems, "metrics.port",
        "0 (any free port) cannot be scraped in a pod: give a fixed port, e.g. 9400");
  }
  if (spec.metrics.port > 0 && spec.metrics.port == spec.rdzv.port) {
    Add(problems, "metrics.port",
        fmt::format("{} is also the rendezvous port (rdzv.port); choose another", spec.metrics.port));
  }
}

}  // namespace cohort::launch
