// Implements kubernetes_backend.h: manifests built as JSON objects (emitted as YAML by
// yaml_emit), and kubectl run with RunAndCapture (manifests on its stdin); the checks are in
// kubernetes_checks.cc, the states read in kubernetes_status.cc. Thread-safety: see the
// header.
#include "cohort/launch/kubernetes_backend.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/worker_env.h"
#include "cohort/launch/agent_command.h"
#include "cohort/launch/kubernetes_internal.h"
#include "cohort/launch/spec_walker.h"
#include "cohort/launch/yaml_emit.h"

namespace cohort::launch {
namespace {

using namespace k8s;  // NOLINT: the backend's shared helpers
using Json = nlohmann::ordered_json;

constexpr const char* kEtcdImage = "quay.io/coreos/etcd:v3.5.17";
constexpr const char* kArrayDir = "/etc/cohort/array";
constexpr int kKubectlTimeoutSeconds = 120;

// ---------------------------------------------------------------------------------------
// Manifests

Json Labels(const JobSpec& spec) {
  return Json{{"app.kubernetes.io/name", "cohort"}, {"cohort.dev/job", spec.name}};
}

Json Metadata(const JobSpec& spec, const std::string& name, Json extra_labels = Json::object()) {
  Json labels = Labels(spec);
  for (auto& [k, v] : extra_labels.items()) labels[k] = v;
  return Json{{"name", name}, {"labels", labels}};
}

// Kubernetes quantities: whole cores as "4", fractions as millicores ("500m").
std::string CpuQuantity(double cpu) {
  if (cpu == std::floor(cpu)) return fmt::format("{}", static_cast<int64_t>(cpu));
  return fmt::format("{}m", std::llround(cpu * 1000));
}

bool IsKubeQuantity(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) return false;
  if (i < text.size() && text[i] == '.') {
    size_t j = ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (i == j) return false;
  }
  std::string_view suffix = text.substr(i);
  static const std::set<std::string_view> kSuffixes = {"",  "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
                                                       "k", "M",  "G",  "T",  "P",  "E"};
  return kSuffixes.count(suffix) > 0;
}

std::string MemoryQuantity(const Resources& r) {
  return IsKubeQuantity(r.memory_text) ? r.memory_text : std::to_string(r.memory_bytes);
}

Json ResourcesJson(const JobSpec& spec) {
  const Resources& r = spec.resources;
  Json amounts = Json::object();
  if (r.cpu > 0) amounts["cpu"] = CpuQuantity(r.cpu);
  if (r.memory_bytes > 0) amounts["memory"] = MemoryQuantity(r);
  if (r.gpu > 0) amounts["nvidia.com/gpu"] = std::to_string(r.gpu);
  for (const auto& [resource, count] : r.extended) amounts[resource] = std::to_string(count);
  if (amounts.empty()) return Json::object();
  return Json{{"requests", amounts}, {"limits", amounts}};
}

// One `cohort run` agent per pod (AgentArgv). `program_args`: the worker arguments
// (ElementArgs), nullopt to leave them out (an array's pods set them).
std::vector<std::string> AgentCommand(const JobSpec& spec, const std::string& cohort_bin,
                                      const std::string& endpoint, const std::string& rdzv_id,
                                      const std::optional<std::vector<std::string>>& program_args) {
  AgentPlan plan;
  plan.metrics_host = "0.0.0.0";  // Prometheus scrapes the pod's address
  if (spec.max_nodes > 1 || UsesEtcd(spec) || !endpoint.empty()) {
    plan.rdzv_backend = spec.rdzv.backend;
    plan.rdzv_endpoint = endpoint;
    plan.rdzv_id = rdzv_id;
    // The etcd rendered with the job may start after the agents: let the first calls
    // retry for a minute instead of the default 5 s.
    if (OwnEtcd(spec)) plan.rdzv_conf.push_back("request_timeout=60");
  }
  return AgentArgv(spec, cohort_bin, plan, program_args);
}

// Everything a job object of this spec shares.
struct Context {
  const JobSpec& spec;
  std::string flavor;
  std::string cohort_bin;
  std::string etcd_run_suffix;  // makes the etcd keys of this submission its own
};

std::string RdzvId(const Context& c, const std::string& object) {
  return UsesEtcd(c.spec) ? fmt::format("{}-{}", object, c.etcd_run_suffix) : object;
}

bool MountsShm(const JobSpec& spec) {
  return std::any_of(spec.mounts.begin(), spec.mounts.end(),
                     [](const Mount& m) { return m.path == "/dev/shm"; });
}

// The worker container. `element_env` (multi-node arrays) overrides the spec's variables.
Json WorkerContainer(const Context& c, const std::string& name,
                     const std::vector<std::string>& command,
                     const std::map<std::string, std::string>& element_env, bool array_volume,
                     const std::string& port_name) {
  const JobSpec& spec = c.spec;
  std::map<std::string, std::string> env = spec.env;
  if (!spec.resources.network_devices.empty()) {
    std::string devices;
    for (const auto& d : spec.resources.network_devices) {
      devices += (devices.empty() ? "" : ",") + d;
    }
    env.emplace("NCCL_SOCKET_IFNAME", devices);  // no override of the user's own value
    env.emplace("GLOO_SOCKET_IFNAME", devices);
  }
  for (const auto& [k, v] : element_env) env[k] = v;
  Json env_list = Json::array();
  for (const auto& [k, v] : env) env_list.push_back(Json{{"name", k}, {"value", v}});
  if (NeedsTokenSecret(spec)) {
    env_list.push_back(Json{
        {"name", worker_env::kToken},
        {"valueFrom", {{"secretKeyRef", {{"name", TokenSecretName(spec)}, {"key", "token"}}}}}});
  }

  Json container = {{"name", name}, {"image", spec.image}, {"command", command}};
  if (!env_list.empty()) container["env"] = env_list;
  Json resources = ResourcesJson(spec);
  if (!resources.empty()) container["resources"] = resources;
  Json ports = Json::array();
  if (!port_name.empty()) {
    ports.push_back({{"name", port_name}, {"containerPort", spec.rdzv.port}, {"protocol", "TCP"}});
  }
  if (spec.metrics.port > 0) {
    ports.push_back({{"name", "metrics"}, {"containerPort", spec.metrics.port}, {"protocol", "TCP"}});
  }
  if (!ports.empty()) container["ports"] = ports;
  Json mounts = Json::array();
  for (const Mount& m : spec.mounts) {
    Json mount = {{"name", m.volume}, {"mountPath", m.path}};
    if (m.read_only) mount["readOnly"] = true;
    mounts.push_back(mount);
  }
  if (!MountsShm(spec)) mounts.push_back({{"name", kShmVolume}, {"mountPath", "/dev/shm"}});
  if (array_volume) {
    mounts.push_back({{"name", kArrayVolume}, {"mountPath", kArrayDir}, {"readOnly", true}});
  }
  container["volumeMounts"] = mounts;
  return container;
}

Json PodSpec(const Context& c, Json container, const std::string& restart_policy,
             bool array_volume) {
  const JobSpec& spec = c.spec;
  Json pod = Json::object();
  if (!restart_policy.empty()) pod["restartPolicy"] = restart_policy;
  if (!spec.priority.empty()) pod["priorityClassName"] = spec.priority;
  if (!spec.placement.node_selector.empty()) {
    Json selector = Json::object();
    for (const auto& [k, v] : spec.placement.node_selector) selector[k] = v;
    pod["nodeSelector"] = selector;
  }
  if (!spec.placement.tolerations.empty()) {
    Json tolerations = Json::array();
    for (const Toleration& t : spec.placement.tolerations) {
      Json tol = Json::object();
      if (!t.key.empty()) tol["key"] = t.key;
      tol["operator"] = t.op;
      if (!t.value.empty()) tol["value"] = t.value;
      if (!t.effect.empty()) tol["effect"] = t.effect;
      if (t.toleration_seconds) tol["tolerationSeconds"] = *t.toleration_seconds;
      tolerations.push_back(tol);
    }
    pod["tolerations"] = tolerations;
  }
  pod["containers"] = Json::array({std::move(container)});
  Json volumes = Json::array();
  for (const Volume& v : spec.volumes) {
    Json volume = {{"name", v.name}};
    if (!v.host_path.empty()) {
      volume["hostPath"] = {{"path", v.host_path}};
    } else if (!v.claim.empty()) {
      volume["persistentVolumeClaim"] = {{"claimName", v.claim}};
    } else {
      volume["nfs"] = {{"server", v.nfs_server}, {"path", v.nfs_path}};
    }
    volumes.push_back(volume);
  }
  // Workers talk through shared memory inside a pod; the container default is 64 MiB.
  if (!MountsShm(spec))
    volumes.push_back({{"name", kShmVolume}, {"emptyDir", {{"medium", "Memory"}}}});
  if (array_volume) {
    volumes.push_back(
        {{"name", kArrayVolume}, {"configMap", {{"name", ArrayConfigMapName(spec)}}}});
  }
  pod["volumes"] = volumes;
  return pod;
}

Json TemplateMetadata(const JobSpec& spec, Json extra_labels) {
  Json labels = Labels(spec);
  labels["cohort.dev/component"] = "worker";
  for (auto& [k, v] : extra_labels.items()) labels[k] = v;
  Json metadata = {{"labels", labels}};
  if (spec.metrics.port > 0) {
    // The annotations Prometheus' kubernetes_sd examples (and most charts) scrape by.
    metadata["annotations"] = {{"prometheus.io/scrape", "true"},
                               {"prometheus.io/port", std::to_string(spec.metrics.port)},
                               {"prometheus.io/path", "/metrics"}};
  }
  return metadata;
}

Json ElementLabel(const ArrayElement* element) {
  if (element == nullptr) return Json::object();
  return Json{{"cohort.dev/array-index", std::to_string(element->index)}};
}

const std::map<std::string, std::string>& ElementEnv(const ArrayElement* element) {
  static const std::map<std::string, std::string> kNone;
  return element ? element->env : kNone;
}

// ttlSecondsAfterFinished of a Volcano or batch/v1 Job spec (a PyTorchJob's runPolicy): the
// finished job and its pods are deleted after that many seconds.
void ApplyTtl(const JobSpec& spec, Json& spec_or_run_policy) {
  if (spec.kubernetes.ttl_seconds_after_finished) {
    spec_or_run_policy["ttlSecondsAfterFinished"] = *spec.kubernetes.ttl_seconds_after_finished;
  }
}

Json PyTorchJobObject(const Context& c, const std::string& object, const ArrayElement* element) {
  const JobSpec& spec = c.spec;
  const std::string endpoint = RendezvousEndpoint(spec, c.flavor, object);
  Json container =
      WorkerContainer(c, "pytorch", AgentCommand(spec, c.cohort_bin, endpoint, RdzvId(c, object),
                   ElementArgs(spec, &ElementEnv(element))),
                      ElementEnv(element), false, "pytorchjob-port");
  Json elastic = {{"minReplicas", spec.min_nodes},
                  {"maxReplicas", spec.max_nodes},
                  {"rdzvBackend", spec.rdzv.backend}};
  if (!endpoint.empty()) {
    // The first endpoint, without a scheme (etcd members may be written as URLs).
    const std::vector<std::string> endpoints = Split(endpoint, ',');
    std::string_view first = endpoints.empty() ? std::string_view() : Trim(endpoints[0]);
    if (StartsWith(first, "http://")) first.remove_prefix(7);
    if (StartsWith(first, "https://")) first.remove_prefix(8);
    if (auto hp = ParseHostPort(first, UsesEtcd(spec) ? kEtcdPort : spec.rdzv.port)) {
      elastic["rdzvHost"] = hp->first;
      elastic["rdzvPort"] = hp->second;
    }
  }
  elastic["rdzvId"] = RdzvId(c, object);
  elastic["maxRestarts"] = spec.max_restarts;
  Json scheduling = {{"minAvailable", spec.min_nodes}};
  if (!spec.queue.empty()) scheduling["queue"] = spec.queue;
  if (!spec.priority.empty()) scheduling["priorityClass"] = spec.priority;
  Json run_policy = {{"backoffLimit", spec.max_restarts}, {"schedulingPolicy", scheduling}};
  if (!spec.kubernetes.clean_pod_policy.empty()) {
    run_policy["cleanPodPolicy"] = spec.kubernetes.clean_pod_policy;
  }
  ApplyTtl(spec, run_policy);
  auto replica = [&](int replicas) {
    return Json{{"replicas", replicas},
                {"restartPolicy", "OnFailure"},
                {"template",
                 {{"metadata", TemplateMetadata(spec, ElementLabel(element))},
                  {"spec", PodSpec(c, container, "", false)}}}};
  };
  // With a Master (the training operator's classic shape: Master + Workers, a fixed size),
  // the Master's pod is the first node; otherwise every node is an elastic Worker.
  Json replicas = Json::object();
  if (HasMaster(spec)) {
    replicas["Master"] = replica(1);
    if (spec.max_nodes > 1) replicas["Worker"] = replica(spec.max_nodes - 1);
  } else {
    replicas["Worker"] = replica(spec.max_nodes);
  }
  Json job_spec = Json::object();
  if (!HasMaster(spec)) job_spec["elasticPolicy"] = elastic;
  job_spec["nprocPerNode"] = std::to_string(spec.nproc_per_node);
  job_spec["runPolicy"] = run_policy;
  job_spec["pytorchReplicaSpecs"] = replicas;
  return Json{{"apiVersion", "kubeflow.org/v1"},
              {"kind", "PyTorchJob"},
              {"metadata", Metadata(spec, object, ElementLabel(element))},
              {"spec", job_spec}};
}

// The worker container of a Volcano or Indexed Job element: every pod runs the same agent
// command; the rendezvous port is named when a pod serves the store.
Json ElementWorkerContainer(const Context& c, const std::string& object,
                            const ArrayElement* element) {
  const JobSpec& spec = c.spec;
  const std::string endpoint = RendezvousEndpoint(spec, c.flavor, object);
  return WorkerContainer(c, "worker",
                         AgentCommand(spec, c.cohort_bin, endpoint, RdzvId(c, object),
                                      ElementArgs(spec, &ElementEnv(element))),
                         ElementEnv(element), false,
                         spec.max_nodes > 1 && !UsesEtcd(spec) ? "rdzv" : "");
}

Json VolcanoJobObject(const Context& c, const std::string& object, const ArrayElement* element) {
  const JobSpec& spec = c.spec;
  Json container = ElementWorkerContainer(c, object, element);
  Json job_spec = {{"schedulerName", "volcano"}, {"minAvailable", spec.min_nodes}};
  if (!spec.queue.empty()) job_spec["queue"] = spec.queue;
  if (!spec.priority.empty()) job_spec["priorityClassName"] = spec.priority;
  if (spec.max_restarts > 0) job_spec["maxRetry"] = spec.max_restarts;
  ApplyTtl(spec, job_spec);
  // A pod whose agent gave up (or crashed) restarts the whole job while retries remain; with
  // no retries it ends the job. An evicted pod (drained node, preemption) restarts it.
  job_spec["policies"] =
      Json::array({{{"event", "PodEvicted"}, {"action", "RestartJob"}},
                   {{"event", "PodFailed"},
                    {"action", spec.max_restarts > 0 ? "RestartJob" : "TerminateJob"}}});
  // svc: headless Service <job> and host names <job>-worker-<i>.<job>; env: VC_TASK_INDEX.
  job_spec["plugins"] = {{"svc", Json::array({"--publish-not-ready-addresses=true"})},
                         {"env", Json::array()}};
  job_spec["tasks"] =
      Json::array({{{"name", "worker"},
                    {"replicas", spec.max_nodes},
                    {"minAvailable", spec.min_nodes},
                    {"template",
                     {{"metadata", TemplateMetadata(spec, ElementLabel(element))},
                      {"spec", PodSpec(c, std::move(container), "Never", false)}}}}});
  return Json{{"apiVersion", "batch.volcano.sh/v1alpha1"},
              {"kind", "Job"},
              {"metadata", Metadata(spec, object, ElementLabel(element))},
              {"spec", job_spec}};
}

// The headless Service that gives Indexed Job pods the names <job>-<i>.<service>.
Json HeadlessService(const JobSpec& spec, const std::string& object, const ArrayElement* element) {
  Json selector = {{"cohort.dev/job", spec.name}, {"cohort.dev/component", "worker"}};
  const Json element_label = ElementLabel(element);
  for (const auto& [k, v] : element_label.items()) selector[k] = v;
  return Json{{"apiVersion", "v1"},
              {"kind", "Service"},
              {"metadata", Metadata(spec, object, ElementLabel(element))},
              {"spec",
               {{"clusterIP", "None"},
                // Pods resolve each other as soon as they have an address, not only when ready.
                {"publishNotReadyAddresses", true},
                {"selector", selector},
                {"ports", Json::array({{{"name", "rdzv"},
                                        {"port", spec.rdzv.port},
                                        {"targetPort", spec.rdzv.port},
                                        {"protocol", "TCP"}}})}}}};
}

// How `queue` reaches the scheduler of a batch/v1 Job: Volcano reads the pod's scheduler
// name and queue annotation; otherwise Kueue reads the Job's queue-name label.
void ApplyBatchQueue(const Context& c, Json& job_metadata, Json& pod_metadata, Json& pod_spec) {
  if (c.flavor == "volcano") {
    pod_spec["schedulerName"] = "volcano";
    if (!c.spec.queue.empty()) {
      pod_metadata["annotations"]["scheduling.volcano.sh/queue-name"] = c.spec.queue;
    }
  } else if (!c.spec.queue.empty()) {
    job_metadata["labels"]["kueue.x-k8s.io/queue-name"] = c.spec.queue;
  }
}

Json IndexedJobObject(const Context& c, const std::string& object, const ArrayElement* element) {
  const JobSpec& spec = c.spec;
  Json container = ElementWorkerContainer(c, object, element);
  Json metadata = Metadata(spec, object, ElementLabel(element));
  Json pod_metadata = TemplateMetadata(spec, ElementLabel(element));
  Json pod = PodSpec(c, std::move(container), "Never", false);
  pod["subdomain"] = object;
  ApplyBatchQueue(c, metadata, pod_metadata, pod);
  Json job_spec = {{"completionMode", "Indexed"},
                   {"completions", spec.max_nodes},
                   {"parallelism", spec.max_nodes},
                   {"backoffLimit", spec.max_restarts},
                   {"template", {{"metadata", pod_metadata}, {"spec", pod}}}};
  ApplyTtl(spec, job_spec);
  return Json{{"apiVersion", "batch/v1"}, {"kind", "Job"}, {"metadata", metadata}, {"spec", job_spec}};
}

// Single-node array: one Indexed Job, completions = elements; pod i sources the file
// /etc/cohort/array/<i> (ConfigMap key "i") before exec'ing its agent.
std::vector<Json> SingleNodeArrayObjects(const Context& c,
                                         const std::vector<ArrayElement>& elements) {
  const JobSpec& spec = c.spec;
  Json data = Json::object();
  for (const auto& e : elements) {
    std::string script;
    for (const auto& [k, v] : e.env) script += fmt::format("export {}={}\n", k, ShellQuote(v));
    const std::vector<std::string> args = ElementArgs(spec, &e.env);
    data[std::to_string(e.index)] =
        script + "set -- \"$@\"" + (args.empty() ? "" : " " + ShellJoin(args)) + "\n";
  }
  Json configmap = {{"apiVersion", "v1"},
                    {"kind", "ConfigMap"},
                    {"metadata", Metadata(spec, ArrayConfigMapName(spec))},
                    {"data", data}};

  std::vector<std::string> command = {
      "/bin/sh", "-c", fmt::format(". \"{}/$JOB_COMPLETION_INDEX\" && exec \"$@\"", kArrayDir),
      "cohort-array"};
  // The worker arguments come from the element's file (`set -- "$@" ...`).
  auto agent = AgentCommand(spec, c.cohort_bin, RendezvousEndpoint(spec, c.flavor, spec.name),
                            RdzvId(c, spec.name), std::nullopt);
  command.insert(command.end(), agent.begin(), agent.end());
  Json container = WorkerContainer(c, "worker", command, {}, true, "");
  const int n = static_cast<int>(elements.size());
  const int parallelism = spec.array.concurrency > 0 ? std::min(spec.array.concurrency, n) : n;
  Json metadata = Metadata(spec, spec.name);
  Json pod_metadata = TemplateMetadata(spec, Json::object());
  Json pod = PodSpec(c, std::move(container), "Never", true);
  ApplyBatchQueue(c, metadata, pod_metadata, pod);
  Json job = {{"apiVersion", "batch/v1"},
              {"kind", "Job"},
              {"metadata", metadata},
              {"spec",
               {{"completionMode", "Indexed"},
                {"completions", n},
                {"parallelism", parallelism},
                // Each element has its own retries; one failing element does not stop others.
                {"backoffLimitPerIndex", spec.max_restarts},
                {"template", {{"metadata", pod_metadata}, {"spec", pod}}}}}};
  ApplyTtl(spec, job["spec"]);
  return {configmap, job};
}

// A one-member etcd for the job's rendezvous (Deployment + Service <name>-etcd:2379).
std::vector<Json> EtcdObjects(const JobSpec& spec) {
  const std::string name = EtcdName(spec);
  Json component = {{"cohort.dev/component", "etcd"}};
  Json selector = {{"cohort.dev/job", spec.name}, {"cohort.dev/component", "etcd"}};
  Json pod_labels = Labels(spec);
  pod_labels["cohort.dev/component"] = "etcd";
  Json container = {
      {"name", "etcd"},
      {"image", kEtcdImage},
      {"command",
       Json::array({"/usr/local/bin/etcd", "--data-dir=/var/lib/etcd/data",
                    fmt::format("--listen-client-urls=http://0.0.0.0:{}", kEtcdPort),
                    fmt::format("--advertise-client-urls=http://{}:{}", name, kEtcdPort)})},
      {"ports",
       Json::array({{{"name", "client"}, {"containerPort", kEtcdPort}, {"protocol", "TCP"}}})},
      {"readinessProbe",
       {{"httpGet", {{"path", "/health"}, {"port", kEtcdPort}}}, {"periodSeconds", 2}}},
      {"resources", {{"requests", {{"cpu", "100m"}, {"memory", "128Mi"}}}}},
      {"volumeMounts", Json::array({{{"name", "data"}, {"mountPath", "/var/lib/etcd"}}})}};
  Json deployment = {
      {"apiVersion", "apps/v1"},
      {"kind", "Deployment"},
      {"metadata", Metadata(spec, name, component)},
      {"spec",
       {{"replicas", 1},
        {"strategy", {{"type", "Recreate"}}},
        {"selector", {{"matchLabels", selector}}},
        {"template",
         {{"metadata", {{"labels", pod_labels}}},
          {"spec",
           {{"containers", Json::array({container})},
            {"volumes", Json::array({{{"name", "data"}, {"emptyDir", Json::object()}}})}}}}}}}};
  Json service = {{"apiVersion", "v1"},
                  {"kind", "Service"},
                  {"metadata", Metadata(spec, name, component)},
                  {"spec",
                   {{"selector", selector},
                    {"ports", Json::array({{{"name", "client"},
                                            {"port", kEtcdPort},
                                            {"targetPort", kEtcdPort},
                                            {"protocol", "TCP"}}})}}}};
  return {deployment, service};
}

// ---------------------------------------------------------------------------------------
// kubectl

std::string Joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// "kubectl ... failed (exit code 1): <stderr>" as kUnavailable: the cluster or the
// network is the usual cause, and the same call may work later.
Status KubectlError(const std::vector<std::string>& argv, const CapturedOutput& o) {
  std::string message(Trim(o.err.empty() ? o.out : o.err));
  return Unavailable("`{}` failed ({}): {}", Joined(argv), o.status.Describe(),
                     message.empty() ? "no message" : message);
}

// Runs kubectl; an error when it cannot start or exits non-zero.
Result<std::string> Kubectl(const BackendOptions& options, std::vector<std::string> args,
                            const std::string& input = "") {
  const std::string& kubectl = options.kubectl;
  if (!options.kube_namespace.empty()) args.insert(args.begin(), {"--namespace", options.kube_namespace});
  if (!options.kube_context.empty()) args.insert(args.begin(), {"--context", options.kube_context});
  args.insert(args.begin(), kubectl);
  auto found = FindProgram(kubectl);
  if (!found.ok()) {
    return FailedPrecondition(
        "the kubernetes backend needs kubectl: {} (install it, or set the kubectl path, and "
        "configure access to the cluster with KUBECONFIG)",
        found.status().message());
  }
  COHORT_ASSIGN_OR_RETURN(
      CapturedOutput o,
      RunAndCapture(args, {}, input, Deadline::After(std::chrono::seconds(kKubectlTimeoutSeconds))));
  if (!o.status.success()) return KubectlError(args, o);
  return o.out;
}

// ---------------------------------------------------------------------------------------
// Backend

class KubernetesBackend : public Backend {
 public:
  explicit KubernetesBackend(BackendOptions options) : options_(std::move(options)) {}

  std::string name() const override { return "kubernetes"; }

  void Validate(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                std::vector<Problem>* problems) override {
    CheckKubernetesSpec(spec, elements, options_.kube_flavor, problems);
  }

  Result<std::string> Render(const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    return RenderKubernetes(spec, elements, options_.kube_flavor, CohortBin());
  }

  // 1. Render (every problem is an InvalidArgument before kubectl runs).
  // 2. `kubectl get` the job objects by label: one still there is AlreadyExists (apply
  //    would silently leave a finished Job as it is instead of running it again).
  // 3. `kubectl apply -f -` with the manifests on stdin.
  // Returns "<resource>/<name>": the kind and the cohort.dev/job label of its objects.
  Result<std::string> Submit(const JobRecord& job, const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    (void)job;
    COHORT_ASSIGN_OR_RETURN(std::string yaml, Render(spec, elements));
    const std::string resource = KubernetesResource(spec, elements, options_.kube_flavor);
    COHORT_ASSIGN_OR_RETURN(
        std::string existing,
        Kubectl(options_,
                {"get", resource, "-l", "cohort.dev/job=" + spec.name, "-o", "name"}));
    if (!Trim(existing).empty()) {
      return AlreadyExists(
          "a job named '{}' is still in the cluster ({}); remove it with `cohort cancel {}` "
          "(or `kubectl delete {} -l cohort.dev/job={}`) or choose another name",
          spec.name, std::string(Trim(existing)), spec.name, resource, spec.name);
    }
    COHORT_ASSIGN_OR_RETURN(
        std::string applied,
        Kubectl(options_, {"apply", "--field-manager=cohort", "-f", "-"}, yaml));
    (void)applied;
    return resource + "/" + spec.name;
  }

  Result<JobStatus> Poll(const JobRecord& job) override {
    auto [resource, name] = Target(job);
    const std::string selector = "cohort.dev/job=" + name;
    COHORT_ASSIGN_OR_RETURN(
        std::string objects,
        Kubectl(options_, {"get", resource, "-l", selector, "-o", "json"}));
    COHORT_ASSIGN_OR_RETURN(
        std::string pods,
        Kubectl(options_,
                {"get", "pods", "-l", selector + ",cohort.dev/component=worker", "-o", "json"}));
    return KubernetesStatusFromJson(resource, objects, pods, job.array_size);
  }

  Status Cancel(const JobRecord& job) override {
    auto [resource, name] = Target(job);
    auto deleted = Kubectl(options_,
                           {"delete", resource + ",services,configmaps,secrets,deployments.apps",
                            "-l", "cohort.dev/job=" + name, "--ignore-not-found", "--wait=false"});
    return deleted.ok() ? Status::Ok() : deleted.status();
  }

  // A multi-node array has one job object per element: deleting it (and its Service) stops
  // that element only, which then reads as cancelled. A single-node array is one Indexed
  // Job, which cannot stop one index alone.
  Status CancelElement(const JobRecord& job, int element) override {
    auto [resource, name] = Target(job);
    if (IsOneIndexedJob(job, resource)) {
      return FailedPrecondition(
          "the elements of job {} run in one Indexed Job, which Kubernetes cannot stop for one "
          "index alone: cancel the whole job (`cohort cancel {}`)",
          job.id, job.id);
    }
    auto deleted = Kubectl(
        options_, {"delete", resource + ",services", "-l",
                   fmt::format("cohort.dev/job={},cohort.dev/array-index={}", name, element),
                   "--ignore-not-found", "--wait=false"});
    return deleted.ok() ? Status::Ok() : deleted.status();
  }

  Result<std::string> LogPath(const JobRecord& job, int element, int rank) override {
    auto [resource, name] = Target(job);
    // Only labels cohort renders on the pods (docs/kubernetes.md).
    std::string selector = "cohort.dev/job=" + name;
    std::string filter;
    if (element >= 0) {
      // A multi-node array is one object per element, its pods labelled with the element's
      // index. A single-node array is one Indexed Job whose pods share one template: pod
      // I is named <job>-<I>-<suffix> (Kubernetes labels it with its index only from 1.28).
      const bool single = IsOneIndexedJob(job, resource);
      if (single) {
        filter = fmt::format(" | grep '^\\[pod/{}-{}-'", name, element);
      } else {
        selector += fmt::format(",cohort.dev/array-index={}", element);
      }
    }
    std::string ranks = rank >= 0
                            ? fmt::format(
                                  " (each pod's log holds the output of all its ranks; look for "
                                  "rank {})",
                                  rank)
                            : "";
    return FailedPrecondition(
        "the kubernetes backend keeps logs in the cluster: run `kubectl logs -l {},"
        "cohort.dev/component=worker --prefix --tail=-1{}`{}",
        selector, filter, ranks);
  }

 private:
  std::string CohortBin() const {
    return options_.cohort_bin.empty() ? std::string("cohort") : options_.cohort_bin;
  }

  // A single-node array, run as one Indexed Job (its elements are that Job's indexes).
  static bool IsOneIndexedJob(const JobRecord& job, const std::string& resource) {
    std::vector<Problem> ignored;
    return job.array_size > 0 && resource == kBatchResource &&
           ParseJobSpec(job.spec_yaml, &ignored).max_nodes == 1;
  }

  // (resource, name) of a submitted job, from its backend id "<resource>/<name>".
  std::pair<std::string, std::string> Target(const JobRecord& job) const {
    auto slash = job.backend_id.find('/');
    if (slash != std::string::npos) {
      return {job.backend_id.substr(0, slash), job.backend_id.substr(slash + 1)};
    }
    const std::string& f = options_.kube_flavor;
    return {f == "pytorchjob" ? kPyTorchResource
            : f == "volcano"  ? kVolcanoResource
                              : kBatchResource,
            job.name};
  }

  BackendOptions options_;
};

}  // namespace

std::string KubernetesResource(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                               const std::string& flavor) {
  if (SingleNodeArray(spec, elements)) return kBatchResource;
  if (flavor == "pytorchjob") return kPyTorchResource;
  if (flavor == "volcano") return kVolcanoResource;
  return kBatchResource;
}

Result<std::vector<nlohmann::ordered_json>> RenderKubernetesObjects(
    const JobSpec& spec, const std::vector<ArrayElement>& elements, const std::string& flavor,
    const std::string& cohort_bin) {
  std::vector<Problem> problems;
  CheckBasics(spec, &problems);
  CheckRendezvous(spec, &problems);
  CheckKubernetesSpec(spec, elements, flavor, &problems);
  if (cohort_bin.empty()) Add(&problems, "cohort binary", "empty path of cohort in the image");
  if (!problems.empty()) {
    return InvalidArgument("the job cannot run on Kubernetes:\n{}", FormatProblems(problems));
  }
  Context c{spec, flavor, cohort_bin, RandomHex(4)};
  std::vector<Json> objects;
  if (NeedsTokenSecret(spec)) {
    objects.push_back({{"apiVersion", "v1"},
                       {"kind", "Secret"},
                       {"metadata", Metadata(spec, TokenSecretName(spec))},
                       {"type", "Opaque"},
                       {"stringData", {{"token", RandomHex(16)}}}});
  }
  if (OwnEtcd(spec)) {
    for (auto& o : EtcdObjects(spec)) objects.push_back(std::move(o));
  }
  if (SingleNodeArray(spec, elements)) {
    for (auto& o : SingleNodeArrayObjects(c, elements)) objects.push_back(std::move(o));
    return objects;
  }
  const auto names = ObjectNames(spec, elements);
  for (size_t i = 0; i < names.size(); ++i) {
    const ArrayElement* element = elements.empty() ? nullptr : &elements[i];
    if (flavor == "pytorchjob") {
      objects.push_back(PyTorchJobObject(c, names[i], element));
    } else if (flavor == "volcano") {
      objects.push_back(VolcanoJobObject(c, names[i], element));
    } else {
      if (spec.max_nodes > 1) objects.push_back(HeadlessService(spec, names[i], element));
      objects.push_back(IndexedJobObject(c, names[i], element));
    }
  }
  return objects;
}

Result<std::string> KubernetesYaml(const std::vector<nlohmann::ordered_json>& objects) {
  std::string yaml;
  for (const auto& object : objects) {
    COHORT_ASSIGN_OR_RETURN(std::string document, JsonToYaml(object));
    yaml += "---\n" + document;
  }
  return yaml;
}

Result<std::string> RenderKubernetes(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                                     const std::string& flavor, const std::string& cohort_bin) {
  COHORT_ASSIGN_OR_RETURN(auto objects,
                          RenderKubernetesObjects(spec, elements, flavor, cohort_bin));
  return KubernetesYaml(objects);
}

std::unique_ptr<Backend> MakeKubernetesBackend(const BackendOptions& options) {
  return std::make_unique<KubernetesBackend>(options);
}

}  // namespace cohort::launch
