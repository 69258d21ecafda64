// Test-only helpers shared by the kubernetes backend's tests (kubernetes_backend_test.cc,
// kubernetes_validate_test.cc, kubernetes_status_test.cc): a shell runner (the offline
// validators, the array wrapper) and the specs every flavor renders: single-node, elastic,
// etcd rendezvous, arrays, accelerators, Master + Worker, and all of them as cases.
//
// Thread-safety: test code; called from the test's own thread.
#pragma once

#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cohort/launch/array.h"
#include "cohort/launch/job_spec.h"

namespace cohort::launch::kubernetes_test {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

inline CommandResult RunShell(const std::string& command) {
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

inline std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

inline JobSpec SingleNodeSpec() {
  JobSpec spec;
  spec.name = "mnist";
  spec.image = "registry.example.com/team/cohort-train:1.0";
  spec.entrypoint = "python3";
  spec.args = {"train.py", "--epochs", "3"};
  spec.nproc_per_node = 2;
  return spec;
}

// SingleNodeSpec named `name` on MIN:MAX nodes.
inline JobSpec NodesSpec(const char* name, int min_nodes, int max_nodes) {
  JobSpec spec = SingleNodeSpec();
  spec.name = name;
  spec.min_nodes = min_nodes;
  spec.max_nodes = max_nodes;
  return spec;
}

inline JobSpec ElasticSpec() {
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

inline JobSpec OwnEtcdSpec() {
  JobSpec spec = NodesSpec("etcdjob", 2, 3);
  spec.rdzv.backend = "etcd";
  return spec;
}

inline JobSpec ExternalEtcdSpec() {
  JobSpec spec = OwnEtcdSpec();
  spec.name = "extetcd";
  spec.rdzv.endpoint = "etcd-0.etcd:2379,etcd-1.etcd:2379";
  return spec;
}

inline std::vector<ArrayElement> Elements(int n) {
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

inline JobSpec SingleNodeArraySpec() {
  JobSpec spec = SingleNodeSpec();
  spec.name = "sweep";
  spec.array.range = "0-4";
  spec.array.concurrency = 2;
  spec.max_restarts = 1;
  spec.queue = "batch";
  return spec;
}

inline JobSpec MultiNodeArraySpec() {
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
inline JobSpec AcceleratorSpec() {
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
inline JobSpec MasterSpec() {
  JobSpec spec = SingleNodeSpec();
  spec.name = "classic";
  spec.min_nodes = spec.max_nodes = 3;
  spec.kubernetes.master = true;
  spec.kubernetes.clean_pod_policy = "Running";
  return spec;
}

inline std::vector<Case> AllCases(const std::string& flavor) {
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

}  // namespace cohort::launch::kubernetes_test
