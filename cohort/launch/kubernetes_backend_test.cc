// Tests of the kubernetes backend without a cluster: every flavor renders a single-node job,
// an elastic multi-node job (volumes, GPUs, env, queue, priority), etcd rendezvous jobs and
// arrays; the manifests are checked field by field, read back by a YAML 1.2 reader (js-yaml)
// and compared with the objects they came from, and validated offline: Kubeflow's and
// Volcano's CRDs with ../shared/k8s/crdvalidate.mjs, core objects with
// tests/k8s/validate-core.mjs (Kubernetes' OpenAPI schemas from the kubernetes-models npm
// package, unknown fields included). Also: Validate's problems, the array wrapper run by a
// real shell, the status mapping of captured `kubectl get -o json` output, and
// Submit/Poll/Cancel through a stand-in kubectl and through the real one with no cluster.
//
// Needs node and tests/k8s/node_modules (tools/install-npm-deps.sh); the CRD checks are
// skipped when ../shared/k8s is absent.
#include "cohort/launch/kubernetes_backend.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <sstream>

#include "cohort/base/strings.h"
#include "cohort/base/temp_dir.h"
#include "cohort/base/subprocess.h"

namespace cohort::launch {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const std::string kSourceDir = COHORT_SOURCE_DIR;
const std::string kNpmDir = kSourceDir + "/tests/k8s";
const std::string kSharedDir = kSourceDir + "/../shared/k8s";


struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CommandResult RunShell(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

bool HaveNode() { return FindProgram("node").ok(); }
bool HaveNodeModules() { return fs::exists(kNpmDir + "/node_modules/kubernetes-models"); }
bool HaveShared() { return fs::exists(kSharedDir + "/crdvalidate.mjs"); }

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------
// Specs

JobSpec SingleNodeSpec() {
  JobSpec spec;
  spec.name = "mnist";
  spec.image = "registry.example.com/team/cohort-train:1.0";
  spec.entrypoint = "python3";
  spec.args = {"train.py", "--epochs", "3"};
  spec.nproc_per_node = 2;
  return spec;
}

// SingleNodeSpec named `name` on MIN:MAX nodes.
JobSpec NodesSpec(const char* name, int min_nodes, int max_nodes) {
  JobSpec spec = SingleNodeSpec();
  spec.name = name;
  spec.min_nodes = min_nodes;
  spec.max_nodes = max_nodes;
  return spec;
}

JobSpec ElasticSpec() {
  JobSpec spec = NodesSpec("fmnist", 1, 4);
  spec.resources.cpu = 4;
  spec.resources.memory_bytes = int64_t{8} << 30;
  spec.resources.memory_text = "8Gi";
  spec.resources.gpu = 1;
  spec.resources.network_devices = {"eth0"};
  spec.env = {{"OMP_NUM_THREADS", "4"}, {"ANSWER", "yes"}, {"NOTE", "a: b # c"}};
  spec.volumes = {{"data", "/mnt/data", "", "", ""},
                  {"ckpt", "", "", "nfs.example.com", "/exports/ckpt"},
                  {"scratch", "", "scratch-claim", "", ""}};
  spec.mounts = {{"data", "/data", true}, {"ckpt", "/ckpt", false}, {"scratch", "/scratch", false}};
  spec.max_restarts = 3;
  spec.queue = "research";
  spec.priority = "high-priority";
  return spec;
}

JobSpec OwnEtcdSpec() {
  JobSpec spec = NodesSpec("etcdjob", 2, 3);
  spec.rdzv.backend = "etcd";
  return spec;
}

JobSpec ExternalEtcdSpec() {
  JobSpec spec = OwnEtcdSpec();
  spec.name = "extetcd";
  spec.rdzv.endpoint = "etcd-0.etcd:2379,etcd-1.etcd:2379";
  return spec;
}

std::vector<ArrayElement> Elements(int n) {
  std::vector<ArrayElement> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({i,
                   {{"COHORT_ARRAY_INDEX", std::to_string(i)},
                    {"COHORT_ARRAY_SIZE", std::to_string(n)},
                    {"LR", fmt::format("0.{}", i + 1)},
                    {"NOTE", "it's $HOME \"quoted\""}}});
  }
  return out;
}

JobSpec SingleNodeArraySpec() {
  JobSpec spec = SingleNodeSpec();
  spec.name = "sweep";
  spec.array.range = "0-4";
  spec.array.concurrency = 2;
  spec.max_restarts = 1;
  spec.queue = "batch";
  return spec;
}

JobSpec MultiNodeArraySpec() {
  JobSpec spec = NodesSpec("msweep", 2, 2);
  spec.array.range = "0-2";
  return spec;
}

struct Case {
  std::string label;
  JobSpec spec;
  std::vector<ArrayElement> elements;
};

// A Trainium-style job: Neuron devices and EFA interfaces, nodes chosen by instance type,
// the accelerator taint tolerated, metrics scraped, finished objects removed after 10 min.
JobSpec AcceleratorSpec() {
  JobSpec spec = ElasticSpec();
  spec.name = "neuron";
  spec.queue = "training";
  spec.resources.extended = {{"aws.amazon.com/neuron", 1}, {"vpc.amazonaws.com/efa", 4}};
  spec.placement.node_selector = {{"node.kubernetes.io/instance-type", "trn1.32xlarge"}};
  spec.placement.tolerations = {
      Toleration{.key = "aws.amazon.com/neuron", .op = "Exists", .effect = "NoSchedule"},
      Toleration{.key = "spot", .op = "Equal", .value = "true", .effect = "NoExecute",
                 .toleration_seconds = 300}};
  spec.metrics.port = 9400;
  spec.kubernetes.ttl_seconds_after_finished = 600;
  return spec;
}

// The training operator's classic shape: a Master and Workers, a fixed size.
JobSpec MasterSpec() {
  JobSpec spec = SingleNodeSpec();
  spec.name = "classic";
  spec.min_nodes = spec.max_nodes = 3;
  spec.kubernetes.master = true;
  spec.kubernetes.clean_pod_policy = "Running";
  return spec;
}

std::vector<Case> AllCases(const std::string& flavor) {
  std::vector<Case> cases = {{"single-node", SingleNodeSpec(), {}},
                             {"elastic", ElasticSpec(), {}},
                             {"own-etcd", OwnEtcdSpec(), {}},
                             {"external-etcd", ExternalEtcdSpec(), {}},
                             {"single-node-array", SingleNodeArraySpec(), Elements(5)},
                             {"multi-node-array", MultiNodeArraySpec(), Elements(3)},
                             {"accelerator", AcceleratorSpec(), {}}};
  if (flavor == "pytorchjob") cases.push_back({"master", MasterSpec(), {}});
  return cases;
}

// ---------------------------------------------------------------------------------------
// Helpers over rendered objects

std::vector<Json> Render(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                         const std::string& flavor) {
  auto objects = RenderKubernetesObjects(spec, elements, flavor, "cohort");
  EXPECT_TRUE(objects.ok()) << objects.status().ToString();
  return objects.ok() ? *objects : std::vector<Json>{};
}

std::vector<const Json*> OfKind(const std::vector<Json>& objects, const std::string& kind) {
  std::vector<const Json*> out;
  for (const auto& o : objects) {
    if (o.value("kind", "") == kind) out.push_back(&o);
  }
  return out;
}

// Copies (not references): operator[] on a missing key of a mutable Json gives null, where
// on a const one it is undefined behaviour.
Json One(const std::vector<Json>& objects, const std::string& kind) {
  auto found = OfKind(objects, kind);
  EXPECT_EQ(found.size(), 1u) << "objects of kind " << kind;
  return found.empty() ? Json() : *found[0];
}

std::vector<std::string> Strings(const Json& j) {
  std::vector<std::string> out;
  for (const auto& v : j) out.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}

// True when `seq` holds `a` immediately followed by `b`.
bool HasPair(const std::vector<std::string>& seq, const std::string& a, const std::string& b) {
  for (size_t i = 0; i + 1 < seq.size(); ++i) {
    if (seq[i] == a && seq[i + 1] == b) return true;
  }
  return false;
}

std::map<std::string, Json> EnvOf(Json container) {
  std::map<std::string, Json> env;
  for (const auto& e : container.value("env", Json::array())) env[e["name"]] = e;
  return env;
}

Json PodSpecOf(Json object) {
  const Json kind = object["kind"];
  if (kind == "PyTorchJob")
    return object["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"];
  if (object["apiVersion"] == "batch.volcano.sh/v1alpha1")
    return object["spec"]["tasks"][0]["template"]["spec"];
  return object["spec"]["template"]["spec"];
}

Json JobObject(const std::vector<Json>& objects, const std::string& flavor) {
  if (flavor == "pytorchjob") return One(objects, "PyTorchJob");
  for (const auto& o : objects) {
    if (o.value("kind", "") == "Job") return o;
  }
  ADD_FAILURE() << "no Job";
  return Json();
}

// ---------------------------------------------------------------------------------------
// Offline validation of every flavor x case

class RenderValidation : public ::testing::TestWithParam<std::string> {};

TEST_P(RenderValidation, EveryCaseIsValidForItsSchemas) {
  const std::string flavor = GetParam();
  ASSERT_TRUE(HaveNode()) << "node is required (tools/install-deps.sh installs it)";
  ASSERT_TRUE(HaveNodeModules()) << "run tools/install-npm-deps.sh (installs " << kNpmDir
                                 << "/node_modules)";
  TempDir dir;
  for (const Case& c : AllCases(flavor)) {
    SCOPED_TRACE(flavor + "/" + c.label);
    auto objects = RenderKubernetesObjects(c.spec, c.elements, flavor, "cohort");
    ASSERT_TRUE(objects.ok()) << objects.status().ToString();
    auto yaml = KubernetesYaml(*objects);
    ASSERT_TRUE(yaml.ok()) << yaml.status().ToString();
    const std::string all = dir.File(c.label + ".yaml", *yaml);

    // A YAML 1.2 reader reads back the very objects.
    auto read = RunShell(fmt::format("node {} {}", Quote(kNpmDir + "/to-json.mjs"), Quote(all)));
    ASSERT_EQ(read.exit_code, 0) << read.output;
    nlohmann::json parsed = nlohmann::json::parse(read.output);
    ASSERT_EQ(parsed.size(), objects->size());
    for (size_t i = 0; i < objects->size(); ++i) {
      EXPECT_EQ(parsed[i], nlohmann::json::parse((*objects)[i].dump())) << "document " << i;
    }

    // Split by schema: Kubeflow / Volcano CRDs, or core Kubernetes objects.
    std::string pytorch, volcano, core;
    // Documents are separated by "---" lines; route each by its apiVersion line.
    std::string current;
    auto flush = [&] {
      if (current.empty()) return;
      if (Contains(current, "\napiVersion: kubeflow.org/v1\n")) {
        pytorch += current;
      } else if (Contains(current, "\napiVersion: batch.volcano.sh/v1alpha1\n")) {
        volcano += current;
      } else {
        core += current;
      }
      current.clear();
    };
    for (const auto& line : Split(*yaml, '\n', false)) {
      if (line == "---") flush();
      current += line + "\n";
    }
    flush();
    if (!core.empty()) {
      auto r = RunShell(fmt::format("node {} {}", Quote(kNpmDir + "/validate-core.mjs"),
                                    Quote(dir.File(c.label + "-core.yaml", core))));
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
    if (!HaveShared()) continue;
    for (const auto& [docs, crd] : {std::pair{pytorch, "kubeflow.org_pytorchjobs.yaml"},
                                    std::pair{volcano, "batch.volcano.sh_jobs.yaml"}}) {
      if (docs.empty()) continue;
      auto r = RunShell(
          fmt::format("node --import {} {} {} {}", Quote(kNpmDir + "/resolve-here.mjs"),
                      Quote(kSharedDir + "/crdvalidate.mjs"), Quote(kSharedDir + "/" + crd),
                      Quote(dir.File(c.label + "-" + crd, docs))));
      EXPECT_EQ(r.exit_code, 0) << r.output;
    }
  }
  if (!HaveShared()) GTEST_SKIP() << kSharedDir << " is absent: CRD validation skipped";
}

INSTANTIATE_TEST_SUITE_P(Flavors, RenderValidation,
                         ::testing::Values("pytorchjob", "volcano", "indexed"));

// The validators themselves reject what the API server would.
TEST(ValidatorsTest, RejectUnknownFieldsAndBadTypes) {
  ASSERT_TRUE(HaveNode() && HaveNodeModules()) << "run tools/install-npm-deps.sh";
  TempDir dir;
  auto core = RunShell(
      fmt::format("node {} {}", Quote(kNpmDir + "/validate-core.mjs"),
                  Quote(dir.File("bad-core.yaml",
                                 "apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec:\n"
                                 "  completions: two\n  template:\n    spec:\n      containers:\n"
                                 "      - {name: w, image: i, imag: typo}\n"))));
  EXPECT_EQ(core.exit_code, 1) << core.output;
  EXPECT_TRUE(Contains(core.output, "/spec/completions must be integer")) << core.output;
  EXPECT_TRUE(Contains(core.output, "unknown field \"imag\"")) << core.output;
  if (!HaveShared()) GTEST_SKIP() << kSharedDir << " is absent";
  auto crd = RunShell(fmt::format(
      "node --import {} {} {} {}", Quote(kNpmDir + "/resolve-here.mjs"),
      Quote(kSharedDir + "/crdvalidate.mjs"), Quote(kSharedDir + "/batch.volcano.sh_jobs.yaml"),
      Quote(dir.File("bad-volcano.yaml",
                     "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: x}\n"
                     "spec: {minAvailable: 1, gang: true}\n"))));
  EXPECT_EQ(crd.exit_code, 1) << crd.output;
  EXPECT_TRUE(Contains(crd.output, "gang")) << crd.output;
}

// ---------------------------------------------------------------------------------------
// Fields, flavor by flavor

TEST(KubernetesRenderTest, PyTorchJobElastic) {
  auto objects = Render(ElasticSpec(), {}, "pytorchjob");
  ASSERT_EQ(objects.size(), 2u);  // Secret (COHORT_TOKEN) + PyTorchJob
  Json secret = One(objects, "Secret");
  EXPECT_EQ(secret["metadata"]["name"], "fmnist-token");
  Json job = One(objects, "PyTorchJob");
  EXPECT_EQ(job["apiVersion"], "kubeflow.org/v1");
  EXPECT_EQ(job["metadata"]["labels"]["app.kubernetes.io/name"], "cohort");
  EXPECT_EQ(job["metadata"]["labels"]["cohort.dev/job"], "fmnist");
  Json elastic = job["spec"]["elasticPolicy"];
  EXPECT_EQ(elastic["minReplicas"], 1);
  EXPECT_EQ(elastic["maxReplicas"], 4);
  EXPECT_EQ(elastic["rdzvBackend"], "c10d");
  EXPECT_EQ(elastic["rdzvHost"], "fmnist-worker-0");
  EXPECT_EQ(elastic["rdzvPort"], 29400);
  EXPECT_EQ(elastic["maxRestarts"], 3);
  EXPECT_EQ(job["spec"]["nprocPerNode"], "2");
  Json policy = job["spec"]["runPolicy"]["schedulingPolicy"];
  EXPECT_EQ(policy["minAvailable"], 1);
  EXPECT_EQ(policy["queue"], "research");
  EXPECT_EQ(policy["priorityClass"], "high-priority");
  EXPECT_EQ(job["spec"]["runPolicy"]["backoffLimit"], 3);
  Json worker = job["spec"]["pytorchReplicaSpecs"]["Worker"];
  EXPECT_EQ(worker["replicas"], 4);
  EXPECT_EQ(worker["restartPolicy"], "OnFailure");
  EXPECT_EQ(worker["template"]["metadata"]["labels"]["cohort.dev/job"], "fmnist");
  Json pod = worker["template"]["spec"];
  EXPECT_EQ(pod["priorityClassName"], "high-priority");
  Json container = pod["containers"][0];
  EXPECT_EQ(container["name"], "pytorch");
  EXPECT_EQ(container["image"], "registry.example.com/team/cohort-train:1.0");
  auto cmd = Strings(container["command"]);
  EXPECT_EQ(cmd[0], "cohort");
  EXPECT_EQ(cmd[1], "run");
  EXPECT_TRUE(HasPair(cmd, "--nnodes", "1:4"));
  EXPECT_TRUE(HasPair(cmd, "--nproc-per-node", "2"));
  EXPECT_TRUE(HasPair(cmd, "--max-restarts", "3"));
  EXPECT_TRUE(HasPair(cmd, "--rdzv-backend", "c10d"));
  EXPECT_TRUE(HasPair(cmd, "--rdzv-endpoint", "fmnist-worker-0:29400"));
  EXPECT_TRUE(HasPair(cmd, "--", "python3"));
  EXPECT_EQ(std::vector<std::string>(cmd.end() - 3, cmd.end()),
            (std::vector<std::string>{"train.py", "--epochs", "3"}));
  EXPECT_EQ(container["ports"][0]["name"], "pytorchjob-port");
  EXPECT_EQ(container["ports"][0]["containerPort"], 29400);
  for (const char* which : {"requests", "limits"}) {
    EXPECT_EQ(container["resources"][which]["cpu"], "4");
    EXPECT_EQ(container["resources"][which]["memory"], "8Gi");
    EXPECT_EQ(container["resources"][which]["nvidia.com/gpu"], "1");
  }
  auto env = EnvOf(container);
  EXPECT_EQ(env["OMP_NUM_THREADS"]["value"], "4");
  EXPECT_EQ(env["NCCL_SOCKET_IFNAME"]["value"], "eth0");
  EXPECT_EQ(env["COHORT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"], "fmnist-token");
  // Volumes: hostPath, nfs, persistentVolumeClaim, and shared memory for the workers.
  std::map<std::string, Json> volumes;
  for (const auto& v : pod["volumes"]) volumes[v["name"]] = v;
  EXPECT_EQ(volumes["data"]["hostPath"]["path"], "/mnt/data");
  EXPECT_EQ(volumes["ckpt"]["nfs"]["server"], "nfs.example.com");
  EXPECT_EQ(volumes["ckpt"]["nfs"]["path"], "/exports/ckpt");
  EXPECT_EQ(volumes["scratch"]["persistentVolumeClaim"]["claimName"], "scratch-claim");
  EXPECT_EQ(volumes["cohort-shm"]["emptyDir"]["medium"], "Memory");
  std::map<std::string, Json> mounts;
  for (const auto& m : container["volumeMounts"]) mounts[m["name"]] = m;
  EXPECT_EQ(mounts["data"]["mountPath"], "/data");
  EXPECT_EQ(mounts["data"]["readOnly"], true);
  EXPECT_FALSE(mounts["ckpt"].contains("readOnly"));
  EXPECT_EQ(mounts["cohort-shm"]["mountPath"], "/dev/shm");
}

TEST(KubernetesRenderTest, VolcanoJobElastic) {
  auto objects = Render(ElasticSpec(), {}, "volcano");
  Json job = One(objects, "Job");
  EXPECT_EQ(job["apiVersion"], "batch.volcano.sh/v1alpha1");
  Json spec = job["spec"];
  EXPECT_EQ(spec["schedulerName"], "volcano");
  EXPECT_EQ(spec["minAvailable"], 1);
  EXPECT_EQ(spec["queue"], "research");
  EXPECT_EQ(spec["priorityClassName"], "high-priority");
  EXPECT_EQ(spec["maxRetry"], 3);
  EXPECT_EQ(spec["policies"][0]["event"], "PodEvicted");
  EXPECT_EQ(spec["policies"][0]["action"], "RestartJob");
  EXPECT_EQ(spec["policies"][1]["event"], "PodFailed");
  EXPECT_TRUE(spec["plugins"].contains("svc"));
  EXPECT_TRUE(spec["plugins"].contains("env"));
  Json task = spec["tasks"][0];
  EXPECT_EQ(task["name"], "worker");
  EXPECT_EQ(task["replicas"], 4);
  EXPECT_EQ(task["minAvailable"], 1);
  EXPECT_EQ(task["template"]["spec"]["restartPolicy"], "Never");
  auto cmd = Strings(task["template"]["spec"]["containers"][0]["command"]);
  EXPECT_TRUE(HasPair(cmd, "--nnodes", "1:4"));
  EXPECT_TRUE(HasPair(cmd, "--rdzv-endpoint", "fmnist-worker-0.fmnist:29400"));
  // No retries: a failed pod ends the job.
  JobSpec once = ElasticSpec();
  once.max_restarts = 0;
  auto strict_objects = Render(once, {}, "volcano");
  Json strict = One(strict_objects, "Job");
  EXPECT_EQ(strict["spec"]["policies"][1]["action"], "TerminateJob");
  EXPECT_FALSE(strict["spec"].contains("maxRetry"));
}

TEST(KubernetesRenderTest, IndexedJobElastic) {
  auto objects = Render(ElasticSpec(), {}, "indexed");
  Json service = One(objects, "Service");
  EXPECT_EQ(service["metadata"]["name"], "fmnist");
  EXPECT_EQ(service["spec"]["clusterIP"], "None");
  EXPECT_EQ(service["spec"]["publishNotReadyAddresses"], true);
  EXPECT_EQ(service["spec"]["selector"]["cohort.dev/job"], "fmnist");
  EXPECT_EQ(service["spec"]["selector"]["cohort.dev/component"], "worker");
  Json job = JobObject(objects, "indexed");
  EXPECT_EQ(job["apiVersion"], "batch/v1");
  EXPECT_EQ(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "research");
  EXPECT_EQ(job["spec"]["completionMode"], "Indexed");
  EXPECT_EQ(job["spec"]["completions"], 4);
  EXPECT_EQ(job["spec"]["parallelism"], 4);
  EXPECT_EQ(job["spec"]["backoffLimit"], 3);
  Json pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["subdomain"], "fmnist");
  EXPECT_EQ(job["spec"]["template"]["metadata"]["labels"]["cohort.dev/component"], "worker");
  auto cmd = Strings(pod["containers"][0]["command"]);
  EXPECT_TRUE(HasPair(cmd, "--nnodes", "1:4"));
  EXPECT_TRUE(HasPair(cmd, "--rdzv-endpoint", "fmnist-0.fmnist:29400"));
}

TEST(KubernetesRenderTest, SingleNodeUsesTheEmbeddedStore) {
  for (const std::string flavor : {"pytorchjob", "volcano", "indexed"}) {
    SCOPED_TRACE(flavor);
    auto objects = Render(SingleNodeSpec(), {}, flavor);
    EXPECT_TRUE(OfKind(objects, "Secret").empty());
    EXPECT_TRUE(OfKind(objects, "Service").empty());
    Json job = JobObject(objects, flavor);
    auto cmd = Strings(PodSpecOf(job)["containers"][0]["command"]);
    EXPECT_TRUE(HasPair(cmd, "--nnodes", "1"));
    EXPECT_TRUE(std::find(cmd.begin(), cmd.end(), "--rdzv-endpoint") == cmd.end());
  }
}

TEST(KubernetesRenderTest, OwnEtcdForEveryFlavor) {
  for (const std::string flavor : {"pytorchjob", "volcano", "indexed"}) {
    SCOPED_TRACE(flavor);
    auto objects = Render(OwnEtcdSpec(), {}, flavor);
    EXPECT_TRUE(OfKind(objects, "Secret").empty());  // etcd needs no COHORT_TOKEN
    Json deployment = One(objects, "Deployment");
    EXPECT_EQ(deployment["metadata"]["name"], "etcdjob-etcd");
    EXPECT_EQ(deployment["spec"]["replicas"], 1);
    Json etcd = deployment["spec"]["template"]["spec"]["containers"][0];
    EXPECT_TRUE(StartsWith(etcd["image"].get<std::string>(), "quay.io/coreos/etcd:v3.5."));
    EXPECT_TRUE(
        Contains(etcd["command"].dump(), "--advertise-client-urls=http://etcdjob-etcd:2379"));
    bool etcd_service = false;
    for (const Json* found : OfKind(objects, "Service")) {
      Json s = *found;
      if (s["metadata"]["name"] == "etcdjob-etcd") {
        etcd_service = true;
        EXPECT_EQ(s["spec"]["selector"]["cohort.dev/component"], "etcd");
        EXPECT_EQ(s["spec"]["ports"][0]["port"], 2379);
      }
    }
    EXPECT_TRUE(etcd_service);
    auto cmd = Strings(PodSpecOf(JobObject(objects, flavor))["containers"][0]["command"]);
    EXPECT_TRUE(HasPair(cmd, "--nnodes", "2:3"));
    EXPECT_TRUE(HasPair(cmd, "--rdzv-backend", "etcd"));
    EXPECT_TRUE(HasPair(cmd, "--rdzv-endpoint", "etcdjob-etcd:2379"));
    EXPECT_TRUE(HasPair(cmd, "--rdzv-conf", "request_timeout=60"));
    auto id = std::find(cmd.begin(), cmd.end(), "--rdzv-id");
    ASSERT_NE(id, cmd.end());
    EXPECT_TRUE(StartsWith(*(id + 1), "etcdjob-"));
  }
}

TEST(KubernetesRenderTest, ExternalEtcd) {
  auto objects = Render(ExternalEtcdSpec(), {}, "pytorchjob");
  EXPECT_TRUE(OfKind(objects, "Deployment").empty());
  Json job = One(objects, "PyTorchJob");
  EXPECT_EQ(job["spec"]["elasticPolicy"]["rdzvBackend"], "etcd");
  EXPECT_EQ(job["spec"]["elasticPolicy"]["rdzvHost"], "etcd-0.etcd");
  EXPECT_EQ(job["spec"]["elasticPolicy"]["rdzvPort"], 2379);
  auto cmd = Strings(PodSpecOf(job)["containers"][0]["command"]);
  EXPECT_TRUE(HasPair(cmd, "--rdzv-endpoint", "etcd-0.etcd:2379,etcd-1.etcd:2379"));
  EXPECT_TRUE(std::find(cmd.begin(), cmd.end(), "--rdzv-conf") == cmd.end());
}

TEST(KubernetesRenderTest, SingleNodeArrayIsOneIndexedJob) {
  for (const std::string flavor : {"pytorchjob", "volcano", "indexed"}) {
    SCOPED_TRACE(flavor);
    auto objects = Render(SingleNodeArraySpec(), Elements(5), flavor);
    ASSERT_EQ(objects.size(), 2u);
    Json configmap = One(objects, "ConfigMap");
    EXPECT_EQ(configmap["metadata"]["name"], "sweep-array");
    ASSERT_EQ(configmap["data"].size(), 5u);
    for (int i = 0; i < 5; ++i) {
      const std::string script = configmap["data"][std::to_string(i)];
      EXPECT_TRUE(Contains(script, fmt::format("export COHORT_ARRAY_INDEX={}\n", i))) << script;
    }
    Json job = One(objects, "Job");
    EXPECT_EQ(job["apiVersion"], "batch/v1");
    EXPECT_EQ(job["spec"]["completionMode"], "Indexed");
    EXPECT_EQ(job["spec"]["completions"], 5);
    EXPECT_EQ(job["spec"]["parallelism"], 2);  // array.concurrency
    EXPECT_EQ(job["spec"]["backoffLimitPerIndex"], 1);
    Json pod = job["spec"]["template"]["spec"];
    EXPECT_EQ(pod["restartPolicy"], "Never");
    auto cmd = Strings(pod["containers"][0]["command"]);
    EXPECT_EQ(cmd[0], "/bin/sh");
    EXPECT_TRUE(HasPair(cmd, "--nnodes", "1"));
    if (flavor == "volcano") {
      EXPECT_EQ(pod["schedulerName"], "volcano");
      EXPECT_EQ(
          job["spec"]["template"]["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"],
          "batch");
    } else {
      EXPECT_EQ(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "batch");
    }
    EXPECT_EQ(KubernetesResource(SingleNodeArraySpec(), Elements(5), flavor), "jobs.batch");
  }
}

// The wrapper really loads element i's variables in a POSIX shell, quotes included, and
// gives the program element i's arguments (with the element's variables substituted).
TEST(KubernetesRenderTest, ArrayWrapperLoadsTheElementEnvironment) {
  JobSpec spec = SingleNodeArraySpec();
  spec.args = {"train.py", "--lr", "$LR", "--note=${NOTE}", "--rank-later=$RANK"};
  auto objects = Render(spec, Elements(5), "indexed");
  Json configmap = One(objects, "ConfigMap");
  auto cmd = Strings(PodSpecOf(One(objects, "Job"))["containers"][0]["command"]);
  ASSERT_GE(cmd.size(), 4u);
  EXPECT_EQ(cmd.back(), "python3");  // the arguments come from the element's file
  TempDir dir;
  for (const auto& [key, script] : configmap["data"].items()) dir.File(key, script);
  std::string wrapper = cmd[2];
  const std::string mount = "/etc/cohort/array";
  ASSERT_TRUE(Contains(wrapper, mount));
  wrapper.replace(wrapper.find(mount), mount.size(), dir.path());
  // Run the wrapper with a shell that prints its environment and arguments in place of the
  // agent.
  auto r = RunShell(fmt::format(
      "JOB_COMPLETION_INDEX=3 /bin/sh -c {} {} /bin/sh -c {} agent", Quote(wrapper),
      Quote(cmd[3]), Quote("/usr/bin/env; for a in \"$@\"; do printf '[%s]\\n' \"$a\"; done")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "COHORT_ARRAY_INDEX=3\n")) << r.output;
  EXPECT_TRUE(Contains(r.output, "COHORT_ARRAY_SIZE=5\n")) << r.output;
  EXPECT_TRUE(Contains(r.output, "LR=0.4\n")) << r.output;
  EXPECT_TRUE(Contains(r.output, "[train.py]\n[--lr]\n[0.4]\n"
                                 "[--note=it's $HOME \"quoted\"]\n[--rank-later=$RANK]\n"))
      << r.output;
  EXPECT_TRUE(Contains(r.output, "NOTE=it's $HOME \"quoted\"\n")) << r.output;
}

TEST(KubernetesRenderTest, MultiNodeArrayIsOneObjectPerElement) {
  for (const std::string flavor : {"pytorchjob", "volcano", "indexed"}) {
    SCOPED_TRACE(flavor);
    auto objects = Render(MultiNodeArraySpec(), Elements(3), flavor);
    std::vector<const Json*> jobs;
    for (const auto& o : objects) {
      if (o.value("kind", "") == "PyTorchJob" || o.value("kind", "") == "Job") jobs.push_back(&o);
    }
    ASSERT_EQ(jobs.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      Json job = *jobs[i];
      const std::string name = fmt::format("msweep-{}", i);
      EXPECT_EQ(job["metadata"]["name"], name);
      EXPECT_EQ(job["metadata"]["labels"]["cohort.dev/job"], "msweep");
      EXPECT_EQ(job["metadata"]["labels"]["cohort.dev/array-index"], std::to_string(i));
      Json container = PodSpecOf(job)["containers"][0];
      auto env = EnvOf(container);
      EXPECT_EQ(env["COHORT_ARRAY_INDEX"]["value"], std::to_string(i));
      EXPECT_EQ(env["NOTE"]["value"], "it's $HOME \"quoted\"");
      auto cmd = Strings(container["command"]);
      EXPECT_TRUE(HasPair(cmd, "--nnodes", "2"));
      const std::string endpoint = flavor == "pytorchjob" ? name + "-worker-0:29400"
                                   : flavor == "volcano"  ? name + "-worker-0." + name + ":29400"
                                                          : name + "-0." + name + ":29400";
      EXPECT_TRUE(HasPair(cmd, "--rdzv-endpoint", endpoint));
    }
    if (flavor == "indexed") {
      EXPECT_EQ(OfKind(objects, "Service").size(), 3u);
    }
  }
}

TEST(KubernetesRenderTest, QuantitiesAndQuoting) {
  JobSpec spec = SingleNodeSpec();
  spec.resources.cpu = 0.5;
  spec.resources.memory_bytes = 1500000000;
  spec.resources.memory_text = "1.5GB";  // not a Kubernetes quantity: bytes are written
  spec.env = {{"FLAG", "on"}, {"EMPTY", ""}, {"NUM", "007"}};
  auto objects = Render(spec, {}, "indexed");
  Json container = PodSpecOf(One(objects, "Job"))["containers"][0];
  EXPECT_EQ(container["resources"]["limits"]["cpu"], "500m");
  EXPECT_EQ(container["resources"]["limits"]["memory"], "1500000000");
  auto yaml = RenderKubernetes(spec, {}, "indexed", "cohort");
  ASSERT_TRUE(yaml.ok());
  EXPECT_TRUE(Contains(*yaml, "value: \"on\"")) << *yaml;   // not a YAML 1.1 boolean
  EXPECT_TRUE(Contains(*yaml, "value: \"007\"")) << *yaml;  // not a number
  EXPECT_TRUE(Contains(*yaml, "value: \"\"")) << *yaml;
}

// ---------------------------------------------------------------------------------------
// Validate

std::vector<Problem> ProblemsOf(const JobSpec& spec, const std::vector<ArrayElement>& elements = {},
                                const std::string& flavor = "pytorchjob") {
  BackendOptions options;
  options.kube_flavor = flavor;
  auto backend = MakeKubernetesBackend(options);
  std::vector<Problem> problems;
  backend->Validate(spec, elements, &problems);
  return problems;
}

bool HasProblem(const std::vector<Problem>& problems, const std::string& where,
                const std::string& what) {
  for (const auto& p : problems) {
    if (p.where == where && Contains(p.what, what)) return true;
  }
  return false;
}

TEST(KubernetesValidateTest, ImageIsRequired) {
  JobSpec spec = SingleNodeSpec();
  spec.image.clear();
  auto problems = ProblemsOf(spec);
  ASSERT_EQ(problems.size(), 1u) << FormatProblems(problems);
  EXPECT_EQ(problems[0].where, "image");
  EXPECT_EQ(problems[0].what,
            "required by the kubernetes backend (the container image with cohort and your "
            "program)");
  // Render refuses the same spec with the problem in its message.
  auto rendered = RenderKubernetes(spec, {}, "pytorchjob", "cohort");
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(rendered.status().message(), "image: required by the kubernetes backend"));
}

TEST(KubernetesValidateTest, ValidSpecsHaveNoProblems) {
  for (const std::string flavor : {"pytorchjob", "volcano", "indexed"}) {
    for (const Case& c : AllCases(flavor)) {
      EXPECT_TRUE(ProblemsOf(c.spec, c.elements, flavor).empty())
          << c.label << "/" << flavor << ": "
          << FormatProblems(ProblemsOf(c.spec, c.elements, flavor));
    }
  }
}

TEST(KubernetesValidateTest, NamesAndKubernetesRules) {
  JobSpec spec = ElasticSpec();
  spec.name = "9lives";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "name", "must start with a letter"));
  spec.name = "bad-";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "name", "is not a DNS-1123 label"));
  spec.name = std::string(56, 'a');  // + "-worker-3" is 65 characters
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "name", "shorten the name by 2 characters"));
  EXPECT_TRUE(ProblemsOf(spec, {}, "indexed").empty());  // "<name>-3" fits

  spec = ElasticSpec();
  spec.priority = "10";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "priority", "name of a PriorityClass"));
  spec.priority = "high";
  spec.queue = "Research_Q";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "queue", "DNS-1123 label"));
  spec.queue = "research";
  spec.volumes[0].name = "cohort-shm";
  spec.mounts[0].volume = "cohort-shm";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "volumes[0].name", "reserved"));
  spec.volumes[0].name = "Data";
  EXPECT_TRUE(HasProblem(ProblemsOf(spec), "volumes[0].name", "DNS-1123 label"));

  EXPECT_TRUE(HasProblem(ProblemsOf(SingleNodeSpec(), {}, "kubeflow"), "kubernetes flavor",
                         "not one of pytorchjob, volcano, indexed"));
}

TEST(KubernetesValidateTest, Arrays) {
  // Multi-node arrays run every element at once: a cap cannot be honoured.
  JobSpec spec = MultiNodeArraySpec();
  spec.array.concurrency = 1;
  EXPECT_TRUE(HasProblem(ProblemsOf(spec, Elements(3)), "array.concurrency",
                         "Kubernetes cannot cap how many run"));
  spec.array.concurrency = 3;
  EXPECT_TRUE(ProblemsOf(spec, Elements(3)).empty());
  // Single-node arrays export their variables in a shell.
  auto elements = Elements(2);
  elements[1].env["my-column"] = "x";
  EXPECT_TRUE(HasProblem(ProblemsOf(SingleNodeArraySpec(), elements), "array",
                         "'my-column' (a column or variable of the elements) is not an "
                         "environment variable name"));
  // More than a ConfigMap holds.
  auto big = Elements(3);
  for (auto& e : big) e.env["BLOB"] = std::string(400000, 'x');
  EXPECT_TRUE(HasProblem(ProblemsOf(SingleNodeArraySpec(), big), "array", "ConfigMap"));
}

// ---------------------------------------------------------------------------------------
// Status from `kubectl get -o json`

std::string List(const std::vector<std::string>& items) {
  std::string s = "{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? "," : "") + items[i];
  return s + "]}";
}

TEST(KubernetesStatusTest, PyTorchJobConditions) {
  auto obj = [](const std::string& conditions) {
    return List({R"({"metadata": {"name": "fmnist", "labels": {"cohort.dev/job": "fmnist"}},
                    "status": {"conditions": [)" +
                 conditions + "]}}"});
  };
  const std::string created = R"({"type": "Created", "status": "True"})";
  const std::string running = R"({"type": "Running", "status": "True"})";
  const std::string done = R"({"type": "Running", "status": "False"},
      {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
       "message": "PyTorchJob fmnist successfully completed."})";
  const std::string failed = R"({"type": "Failed", "status": "True", "reason": "PyTorchJobFailed",
       "message": "PyTorchJob fmnist is failed because 1 Worker replica(s) failed."})";
  auto st = KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created), "", 0);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, "pending");
  EXPECT_EQ(
      KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created + "," + running), "", 0)
          ->state,
      "running");
  st = KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created + "," + done), "", 0);
  EXPECT_EQ(st->state, "succeeded");
  EXPECT_EQ(st->exit_code, 0);
  const std::string pods = List({R"({"metadata": {"name": "fmnist-worker-1"},
      "status": {"phase": "Failed", "containerStatuses": [{"name": "pytorch",
        "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}})"});
  st = KubernetesStatusFromJson("pytorchjobs.kubeflow.org", obj(created + "," + failed), pods, 0);
  EXPECT_EQ(st->state, "failed");
  EXPECT_EQ(st->exit_code, 1);
  EXPECT_TRUE(Contains(st->detail, "1 Worker replica(s) failed")) << st->detail;
}

TEST(KubernetesStatusTest, VolcanoPhases) {
  auto obj = [](const std::string& phase) {
    return List({R"({"metadata": {"name": "fmnist"}, "status": {"state": {"phase": ")" + phase +
                 R"("}}})"});
  };
  const std::map<std::string, std::string> expected = {
      {"Pending", "pending"},     {"Running", "running"},   {"Restarting", "running"},
      {"Completed", "succeeded"}, {"Failed", "failed"},     {"Terminated", "failed"},
      {"Aborted", "failed"},      {"Completing", "running"}};
  for (const auto& [phase, state] : expected) {
    auto st = KubernetesStatusFromJson("jobs.batch.volcano.sh", obj(phase), "", 0);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->state, state) << phase;
  }
}

TEST(KubernetesStatusTest, IndexedArrayElements) {
  const std::string job = List({R"({"metadata": {"name": "sweep"},
      "status": {"active": 1, "completedIndexes": "0-1,3", "failedIndexes": "2"}})"});
  const std::string pods = List({
      R"({"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "2"}},
          "status": {"phase": "Failed", "containerStatuses": [{"name": "worker",
            "state": {"terminated": {"exitCode": 3}}}]}})",
      R"({"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "4"}},
          "status": {"phase": "Running"}})"});
  auto st = KubernetesStatusFromJson("jobs.batch", job, pods, 6);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, "running");
  ASSERT_EQ(st->elements.size(), 6u);
  const std::vector<std::string> states = {"succeeded", "succeeded", "failed",
                                           "succeeded", "running",   "pending"};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(st->elements[i].state, states[i]) << i;
  EXPECT_EQ(st->elements[2].exit_code, 3);
  // The Job ends Failed: what never finished is reported as cancelled.
  const std::string failed = List({R"({"metadata": {"name": "sweep"},
      "status": {"completedIndexes": "0-1,3", "failedIndexes": "2",
        "conditions": [{"type": "Failed", "status": "True", "reason": "FailedIndexes",
                        "message": "Job has failed indexes"}]}})"});
  st = KubernetesStatusFromJson("jobs.batch", failed, pods, 6);
  EXPECT_EQ(st->state, "failed");
  EXPECT_EQ(st->elements[5].state, "cancelled");
  EXPECT_TRUE(Contains(st->detail, "FailedIndexes"));
}

TEST(KubernetesStatusTest, OneObjectPerElement) {
  auto element = [](int i, const std::string& conditions) {
    return fmt::format(R"({{"metadata": {{"name": "msweep-{0}",
        "labels": {{"cohort.dev/job": "msweep", "cohort.dev/array-index": "{0}"}}}},
        "status": {{"conditions": [{1}]}}}})",
                       i, conditions);
  };
  const std::string ok = R"({"type": "Complete", "status": "True"})";
  const std::string bad =
      R"({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"})";
  auto st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(1, "")}), "", 2);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, "running");
  EXPECT_EQ(st->elements[0].state, "succeeded");
  EXPECT_EQ(st->elements[1].state, "pending");
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(1, bad)}), "", 2);
  EXPECT_EQ(st->state, "failed");
  EXPECT_EQ(st->detail, "1 of 2 elements failed");
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(1, ok)}), "", 2);
  EXPECT_EQ(st->state, "succeeded");
  // Element 1's object deleted (cohort cancel --element): cancelled, not failed; the job
  // waits for the others, then succeeds with them.
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ""), element(2, ok)}), "", 3);
  EXPECT_EQ(st->elements[1].state, "cancelled");
  EXPECT_EQ(st->state, "running");
  st = KubernetesStatusFromJson("jobs.batch", List({element(0, ok), element(2, ok)}), "", 3);
  EXPECT_EQ(st->state, "succeeded");
}

TEST(KubernetesStatusTest, MissingAndMalformed) {
  auto st = KubernetesStatusFromJson("jobs.batch", List({}), "", 0);
  EXPECT_EQ(st.status().code(), StatusCode::kNotFound);
  st = KubernetesStatusFromJson("jobs.batch", "error: not json", "", 0);
  EXPECT_EQ(st.status().code(), StatusCode::kInternal);
}

// ---------------------------------------------------------------------------------------
// Submit / Poll / Cancel / LogPath

// A stand-in kubectl: records its arguments and stdin, answers `get` from files.
std::string FakeKubectl(const TempDir& dir) {
  return dir.File("kubectl", R"(#!/bin/sh
d=$(dirname "$0")
echo "$*" >> "$d/calls"
case "$1" in
  apply) cat > "$d/applied.yaml"; echo "pytorchjob.kubeflow.org/fmnist created";;
  get)
    if [ "$3" = pods ] || [ "$2" = pods ]; then cat "$d/pods.json" 2>/dev/null; exit 0; fi
    for a in "$@"; do
      if [ "$a" = name ]; then cat "$d/existing" 2>/dev/null; exit 0; fi
    done
    cat "$d/objects.json";;
  delete) echo "deleted";;
  *) echo "unexpected: $*" >&2; exit 1;;
esac
)",
                  true);
}

JobRecord Record(const std::string& backend_id) {
  JobRecord job;
  job.id = 7;
  job.name = "fmnist";
  job.backend = "kubernetes";
  job.backend_id = backend_id;
  return job;
}

TEST(KubernetesBackendTest, SubmitPollCancelWithStandInKubectl) {
  TempDir dir;
  BackendOptions options;
  options.kubectl = FakeKubectl(dir);
  options.cohort_bin = "/opt/cohort/bin/cohort";
  auto backend = MakeKubernetesBackend(options);
  EXPECT_EQ(backend->name(), "kubernetes");

  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "pytorchjobs.kubeflow.org/fmnist");
  const std::string applied = dir.Read("applied.yaml");
  EXPECT_TRUE(Contains(applied, "kind: PyTorchJob")) << applied;
  EXPECT_TRUE(Contains(applied, "kind: Secret")) << applied;
  EXPECT_TRUE(Contains(applied, "- /opt/cohort/bin/cohort\n")) << applied;
  std::string calls = dir.Read("calls");
  EXPECT_TRUE(Contains(calls, "get pytorchjobs.kubeflow.org -l cohort.dev/job=fmnist -o name"))
      << calls;
  EXPECT_TRUE(Contains(calls, "apply --field-manager=cohort -f -")) << calls;

  // A job of that name still in the cluster.
  dir.File("existing", "pytorchjob.kubeflow.org/fmnist\n");
  auto again = backend->Submit(Record(""), ElasticSpec(), {});
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(again.status().message(), "cohort cancel fmnist"))
      << again.status().message();

  dir.File("objects.json", List({R"({"metadata": {"name": "fmnist"},
      "status": {"conditions": [{"type": "Running", "status": "True"}]}})"}));
  auto st = backend->Poll(Record(*id));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->state, "running");
  calls = dir.Read("calls");
  EXPECT_TRUE(Contains(calls, "get pytorchjobs.kubeflow.org -l cohort.dev/job=fmnist -o json"));
  EXPECT_TRUE(
      Contains(calls, "get pods -l cohort.dev/job=fmnist,cohort.dev/component=worker -o json"));

  Status cancelled = backend->Cancel(Record(*id));
  EXPECT_TRUE(cancelled.ok()) << cancelled.ToString();
  EXPECT_TRUE(Contains(dir.Read("calls"),
                       "delete pytorchjobs.kubeflow.org,services,configmaps,secrets,"
                       "deployments.apps -l cohort.dev/job=fmnist --ignore-not-found"));

  // Invalid specs never reach kubectl.
  JobSpec no_image = ElasticSpec();
  no_image.image.clear();
  auto refused = backend->Submit(Record(""), no_image, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST(KubernetesBackendTest, LogPathSaysWhereLogsAre) {
  auto backend = MakeKubernetesBackend(BackendOptions{});
  auto path = backend->LogPath(Record("pytorchjobs.kubeflow.org/fmnist"), -1, -1);
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(path.status().message(), "kubectl logs -l cohort.dev/job=fmnist"))
      << path.status().message();
  JobRecord element = Record("pytorchjobs.kubeflow.org/fmnist");
  element.array_size = 3;
  path = backend->LogPath(element, 2, -1);
  EXPECT_TRUE(Contains(path.status().message(), "cohort.dev/job=fmnist,cohort.dev/array-index=2"))
      << path.status().message();
}

// A single-node array is one Indexed Job: the hint selects pods by labels the rendered pods
// carry (not batch.kubernetes.io/job-completion-index, a label only from Kubernetes 1.28)
// and picks element I's pod by its name, <job>-<I>-<suffix>.
TEST(KubernetesBackendTest, LogHintOfAnIndexedJobElementUsesRenderedLabelsAndThePodName) {
  JobSpec spec = NodesSpec("sweep", 1, 1);
  spec.image = "registry.example.com/train:1";
  const std::vector<ArrayElement> elements = {{0, {}}, {1, {}}, {2, {}}};
  auto manifests = RenderKubernetes(spec, elements, "indexed", "cohort");
  ASSERT_TRUE(manifests.ok()) << manifests.status().ToString();
  auto backend = MakeKubernetesBackend(BackendOptions{});
  JobRecord job = Record("jobs.batch/sweep");
  job.spec_yaml = JobSpecToYaml(spec);
  job.array_size = 3;
  auto path = backend->LogPath(job, 2, -1);
  const std::string hint = path.status().message();
  EXPECT_TRUE(Contains(hint, "kubectl logs -l cohort.dev/job=sweep,cohort.dev/component=worker "
                             "--prefix --tail=-1 | grep '^\\[pod/sweep-2-'"))
      << hint;
  EXPECT_FALSE(Contains(hint, "job-completion-index")) << hint;
  // Every label of the selector is on the rendered pod template.
  EXPECT_TRUE(Contains(*manifests, "cohort.dev/job: sweep")) << *manifests;
  EXPECT_TRUE(Contains(*manifests, "cohort.dev/component: worker")) << *manifests;
}

TEST(KubernetesBackendTest, CancelElementDeletesThatElementsObjectsOnly) {
  TempDir dir;
  BackendOptions options;
  options.kubectl = FakeKubectl(dir);
  auto backend = MakeKubernetesBackend(options);
  JobRecord job = Record("jobs.batch/msweep");
  job.array_size = 3;
  job.spec_yaml = JobSpecToYaml(NodesSpec("msweep", 2, 2));
  Status st = backend->CancelElement(job, 1);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(Contains(dir.Read("calls"),
                       "delete jobs.batch,services -l cohort.dev/job=msweep,"
                       "cohort.dev/array-index=1 --ignore-not-found --wait=false"))
      << dir.Read("calls");
  // A single-node array is one Indexed Job: one index cannot be stopped alone.
  JobRecord indexed = Record("jobs.batch/sweep");
  indexed.array_size = 3;
  indexed.spec_yaml = JobSpecToYaml(NodesSpec("sweep", 1, 1));
  st = backend->CancelElement(indexed, 1);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(st.message(), "one Indexed Job")) << st.message();
}

TEST(KubernetesBackendTest, MissingKubectl) {
  BackendOptions options;
  options.kubectl = "/nonexistent/kubectl";
  auto backend = MakeKubernetesBackend(options);
  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  EXPECT_EQ(id.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(id.status().message(), "needs kubectl")) << id.status().message();
}

// The real kubectl with a kubeconfig whose API server does not exist: Submit fails with
// kubectl's own message.
TEST(KubernetesBackendTest, RealKubectlWithoutCluster) {
  if (!FindProgram("kubectl").ok()) GTEST_SKIP() << "kubectl is not installed";
  TempDir dir;
  const std::string config = dir.File("kubeconfig", R"(apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:1"}
contexts:
- name: none
  context: {cluster: none, user: nobody}
current-context: none
users:
- name: nobody
  user: {token: not-a-token}
)");
  const char* old = std::getenv("KUBECONFIG");
  std::string saved = old ? old : "";
  ::setenv("KUBECONFIG", config.c_str(), 1);
  auto backend = MakeKubernetesBackend(BackendOptions{});
  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  if (old) {
    ::setenv("KUBECONFIG", saved.c_str(), 1);
  } else {
    ::unsetenv("KUBECONFIG");
  }
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(id.status().message(), "kubectl get pytorchjobs.kubeflow.org"))
      << id.status().message();
  EXPECT_TRUE(Contains(id.status().message(), "127.0.0.1:1")) << id.status().message();
  EXPECT_TRUE(Contains(id.status().message(), "connection refused")) << id.status().message();
}


// ---------------------------------------------------------------------------------------
// Accelerators, placement, metrics, Master + Worker

TEST(KubernetesRenderTest, AcceleratorResourcesPlacementAndMetrics) {
  for (const std::string flavor : {"pytorchjob", "volcano", "indexed"}) {
    SCOPED_TRACE(flavor);
    auto objects = Render(AcceleratorSpec(), {}, flavor);
    Json job = One(objects, flavor == "pytorchjob" ? "PyTorchJob" : "Job");
    Json pod = PodSpecOf(job);
    Json container = pod["containers"][0];
    EXPECT_EQ(container["resources"]["limits"]["aws.amazon.com/neuron"], "1");
    EXPECT_EQ(container["resources"]["limits"]["vpc.amazonaws.com/efa"], "4");
    EXPECT_EQ(pod["nodeSelector"]["node.kubernetes.io/instance-type"], "trn1.32xlarge");
    ASSERT_EQ(pod["tolerations"].size(), 2u);
    EXPECT_EQ(pod["tolerations"][0],
              Json({{"key", "aws.amazon.com/neuron"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}));
    EXPECT_EQ(pod["tolerations"][1]["tolerationSeconds"], 300);
    bool metrics_port = false;
    for (const auto& p : container["ports"]) metrics_port |= p["name"] == "metrics" && p["containerPort"] == 9400;
    EXPECT_TRUE(metrics_port) << container.dump();
    auto cmd = Strings(container["command"]);
    EXPECT_TRUE(HasPair(cmd, "--metrics-port", "9400"));
    EXPECT_TRUE(HasPair(cmd, "--metrics-host", "0.0.0.0"));
    Json annotations = flavor == "pytorchjob"
                           ? job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"]
                       : flavor == "volcano" ? job["spec"]["tasks"][0]["template"]["metadata"]["annotations"]
                                             : job["spec"]["template"]["metadata"]["annotations"];
    EXPECT_EQ(annotations["prometheus.io/scrape"], "true");
    EXPECT_EQ(annotations["prometheus.io/port"], "9400");
    const Json ttl = flavor == "pytorchjob" ? job["spec"]["runPolicy"]["ttlSecondsAfterFinished"]
                                            : job["spec"]["ttlSecondsAfterFinished"];
    EXPECT_EQ(ttl, 600);
  }
}

TEST(KubernetesRenderTest, PyTorchJobWithMasterAndWorkers) {
  auto objects = Render(MasterSpec(), {}, "pytorchjob");
  Json job = One(objects, "PyTorchJob");
  EXPECT_FALSE(job["spec"].contains("elasticPolicy"));
  Json replicas = job["spec"]["pytorchReplicaSpecs"];
  EXPECT_EQ(replicas["Master"]["replicas"], 1);
  EXPECT_EQ(replicas["Worker"]["replicas"], 2);
  EXPECT_EQ(job["spec"]["runPolicy"]["cleanPodPolicy"], "Running");
  // Every node runs the same agent; the Master's pod serves the rendezvous store.
  for (const char* role : {"Master", "Worker"}) {
    auto cmd = Strings(replicas[role]["template"]["spec"]["containers"][0]["command"]);
    EXPECT_TRUE(HasPair(cmd, "--nnodes", "3")) << role;
    EXPECT_TRUE(HasPair(cmd, "--rdzv-endpoint", "classic-master-0:29400")) << role;
  }
  // One node: a Master alone.
  JobSpec one = MasterSpec();
  one.min_nodes = one.max_nodes = 1;
  Json single = One(Render(one, {}, "pytorchjob"), "PyTorchJob");
  EXPECT_TRUE(single["spec"]["pytorchReplicaSpecs"].contains("Master"));
  EXPECT_FALSE(single["spec"]["pytorchReplicaSpecs"].contains("Worker"));
}

TEST(KubernetesValidateTest, FieldsAFlavorCannotHonourAreProblems) {
  EXPECT_TRUE(HasProblem(ProblemsOf(MasterSpec(), {}, "volcano"), "kubernetes.master",
                         "only the pytorchjob flavor"));
  EXPECT_TRUE(HasProblem(ProblemsOf(MasterSpec(), {}, "indexed"), "kubernetes.clean_pod_policy",
                         "only the pytorchjob flavor"));
  JobSpec elastic = MasterSpec();
  elastic.min_nodes = 1;
  EXPECT_TRUE(HasProblem(ProblemsOf(elastic, {}, "pytorchjob"), "kubernetes.master", "fixed size"));
  JobSpec any_port = AcceleratorSpec();
  any_port.metrics.port = 0;
  EXPECT_TRUE(HasProblem(ProblemsOf(any_port, {}, "indexed"), "metrics.port", "fixed port"));
}

// A target's kube context and namespace reach every kubectl call.
TEST(KubernetesBackendTest, ContextAndNamespaceReachKubectl) {
  TempDir dir;
  const std::string kubectl = dir.File("kubectl", "#!/bin/sh\necho \"$@\" >> \"$0.calls\"\n"
                                                  "echo 'error: context was not found' >&2\nexit 1\n");
  ::chmod(kubectl.c_str(), 0755);
  BackendOptions options;
  options.kubectl = kubectl;
  options.kube_context = "eu-west";
  options.kube_namespace = "training";
  auto backend = MakeKubernetesBackend(options);
  auto id = backend->Submit(Record(""), ElasticSpec(), {});
  ASSERT_FALSE(id.ok());
  std::ifstream calls(kubectl + ".calls");
  std::string first;
  std::getline(calls, first);
  EXPECT_TRUE(StartsWith(first, "--context eu-west --namespace training get ")) << first;
}

}  // namespace
}  // namespace cohort::launch
