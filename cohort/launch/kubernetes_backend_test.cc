// Tests of the kubernetes backend's rendering without a cluster: every flavor renders a
// single-node job, an elastic multi-node job (volumes, GPUs, env, queue, priority), etcd
// rendezvous jobs, arrays (the array wrapper run by a real shell), accelerators, placement,
// metrics and the Master + Worker shape; the manifests are checked field by field.
// Schema validation and Validate's problems: kubernetes_validate_test.cc; status, Submit,
// Poll, Cancel and logs: kubernetes_status_test.cc.
#include "cohort/launch/kubernetes_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "cohort/base/strings.h"
#include "cohort/base/temp_dir.h"
#include "cohort/launch/kubernetes_test_util.h"

namespace cohort::launch::kubernetes_test {
namespace {

using Json = nlohmann::ordered_json;

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

// The tests that hold for every flavor run once per flavor.
class KubernetesFlavorTest : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(AllFlavors, KubernetesFlavorTest,
                         ::testing::Values("pytorchjob", "volcano", "indexed"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_P(KubernetesFlavorTest, SingleNodeUsesTheEmbeddedStore) {
  const std::string& flavor = GetParam();
  auto objects = Render(SingleNodeSpec(), {}, flavor);
  EXPECT_TRUE(OfKind(objects, "Secret").empty());
  EXPECT_TRUE(OfKind(objects, "Service").empty());
  Json job = JobObject(objects, flavor);
  auto cmd = Strings(PodSpecOf(job)["containers"][0]["command"]);
  EXPECT_TRUE(HasPair(cmd, "--nnodes", "1"));
  EXPECT_TRUE(std::find(cmd.begin(), cmd.end(), "--rdzv-endpoint") == cmd.end());
}

TEST_P(KubernetesFlavorTest, OwnEtcd) {
  const std::string& flavor = GetParam();
  auto objects = Render(OwnEtcdSpec(), {}, flavor);
  EXPECT_TRUE(OfKind(objects, "Secret").empty());  // etcd needs no COHORT_TOKEN
  Json deployment = One(objects, "Deployment");
  EXPECT_EQ(deployment["metadata"]["name"], "etcdjob-etcd");
  EXPECT_EQ(deployment["spec"]["replicas"], 1);
  Json etcd = deployment["spec"]["template"]["spec"]["containers"][0];
  EXPECT_TRUE(StartsWith(etcd["image"].get<std::string>(), "quay.io/coreos/etcd:v3.5."));
  EXPECT_TRUE(Contains(etcd["command"].dump(), "--advertise-client-urls=http://etcdjob-etcd:2379"));
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

TEST_P(KubernetesFlavorTest, SingleNodeArrayIsOneIndexedJob) {
  const std::string& flavor = GetParam();
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

TEST_P(KubernetesFlavorTest, MultiNodeArrayIsOneObjectPerElement) {
  const std::string& flavor = GetParam();
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
// Accelerators, placement, metrics, Master + Worker

TEST_P(KubernetesFlavorTest, AcceleratorResourcesPlacementAndMetrics) {
  const std::string& flavor = GetParam();
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

}  // namespace
}  // namespace cohort::launch::kubernetes_test
