// JobSpec: one training job described once (YAML) and run by any backend (local, slurm,
// kubernetes). Parsing collects every problem with the path of its field
// ("resources.memory: ...") instead of stopping at the first, so a user fixes a spec in one
// pass; nothing is submitted while any problem remains.
//
// YAML shape (every field but `name` and `entrypoint` optional):
//   name: fmnist            # [a-z0-9-], <= 63 chars (a Kubernetes/Slurm job name)
//   image: registry/img:tag # required by the kubernetes backend
//   entrypoint: python3     # program run by every worker; a .py file runs with the job's
//                           # Python (COHORT_PYTHON, default python3), as `cohort run` does;
//                           # a relative path is relative to the spec (local, slurm)
//   module: pkg.train       # instead of entrypoint: python -m pkg.train
//   args: [train.py, --epochs, "3"]
//   nnodes: "1:4"           # N or MIN:MAX
//   nproc_per_node: 2
//   resources: {cpu: 4, memory: 8Gi, gpu: 1, network_devices: [eth0],
//               extended: {aws.amazon.com/neuron: 1, vpc.amazonaws.com/efa: 4}}
//   placement: {node_selector: {key: value}, tolerations: [{key, operator, value, effect}]}
//   metrics: {port: 9400, host: 0.0.0.0}   # every agent serves Prometheus /metrics
//   kubernetes: {master: true, clean_pod_policy: Running, ttl_seconds_after_finished: 600}
//   env: {KEY: value}
//   volumes: [{name: data, host_path: /mnt/data} | {name: ckpt, nfs: {server: s, path: /x}}
//             | {name: pvc, claim: my-claim}]
//   mounts: [{volume: data, path: /data, read_only: true}]
//   max_restarts: 3
//   queue: default          # Slurm partition, Volcano queue
//   priority: high          # Slurm --nice from a number, else Kubernetes priorityClassName
//   rdzv: {backend: c10d | etcd, endpoint: host:port, port: 29400}
//   array: {range: "0-99", manifest: file.csv, from_sql: "SELECT ...", db: sqlite:///x.db,
//           concurrency: 10, columns: [region, path], target_by: region | round-robin}
//   targets: [{name: east, backend: local | slurm | kubernetes, concurrency: 2,
//              context: kube-context, namespace: ns, flavor: indexed,
//              cluster: slurm-cluster, partition: gpu, env: {K: v}}]
//   overrides: {kubernetes: {placement: {...}, volumes: [...]}, slurm: {queue: gpu}}
//                           # per backend, merged over the spec before it is validated for
//                           # that backend (maps merged key by key, anything else replaced)
//
// `args` may name the job's variables as ${NAME} or $NAME (array columns, COHORT_ARRAY_*,
// target and spec `env`); every backend substitutes them the same way (ExpandArgs).
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::launch {

// One problem in a spec: where (a field path such as "resources.memory", or "line 3" for
// YAML syntax) and what is wrong, phrased so the user knows what to write instead.
struct Problem {
  std::string where;
  std::string what;
  std::string ToString() const { return where.empty() ? what : where + ": " + what; }
};

struct Resources {
  double cpu = 0;                // cores per node (0: not requested)
  int64_t memory_bytes = 0;      // per node (0: not requested)
  std::string memory_text;       // as written ("8Gi"), for rendering
  int gpu = 0;                   // per node
  std::vector<std::string> network_devices;
  // Kubernetes extended resources per node ("aws.amazon.com/neuron" -> 1): limits on
  // Kubernetes, --gres on Slurm (SlurmGresName), refused where nothing can reserve them.
  std::map<std::string, int64_t> extended;
};

struct Toleration {
  std::string key;
  std::string op = "Equal";  // Equal | Exists
  std::string value;
  std::string effect;        // "" (all) | NoSchedule | PreferNoSchedule | NoExecute
  std::optional<int64_t> toleration_seconds;
};

// Where the nodes of a job may be. A node selector is a requirement (refused by backends
// that cannot place by node labels); tolerations only permit, so backends without taints
// (local, slurm) have nothing to do for them.
struct Placement {
  std::map<std::string, std::string> node_selector;
  std::vector<Toleration> tolerations;
  bool empty() const { return node_selector.empty() && tolerations.empty(); }
};

// Every agent serves Prometheus /metrics (and the dashboard) on `port` (0: any free port).
struct MetricsSpec {
  int port = -1;     // -1: no endpoint
  std::string host;  // "" : the backend's default (local 127.0.0.1, pods and nodes 0.0.0.0)
  bool enabled() const { return port >= 0; }
};

// Fields only the kubernetes backend reads.
struct KubernetesSpec {
  std::optional<bool> master;            // PyTorchJob: one Master replica + Workers
  std::string clean_pod_policy;          // PyTorchJob: None | Running | All
  std::optional<int64_t> ttl_seconds_after_finished;
};

// One place an array element can run: a backend and where on it.
struct Target {
  std::string name;        // what elements name in their target column
  std::string backend;     // local | slurm | kubernetes
  int concurrency = 0;     // elements of this target at once (0: the array's concurrency)
  std::string context;     // kubernetes: kubectl --context
  std::string kube_namespace;  // kubernetes: kubectl --namespace
  std::string flavor;      // kubernetes: pytorchjob | volcano | indexed ("" : submit's)
  std::string cluster;     // slurm: --clusters (needs slurmdbd)
  std::string partition;   // slurm: overrides queue
  std::map<std::string, std::string> env;  // added to the element's variables
};

struct Volume {
  std::string name;
  std::string host_path;   // one of host_path, claim, nfs_server+nfs_path
  std::string claim;       // a PersistentVolumeClaim (kubernetes)
  std::string nfs_server;
  std::string nfs_path;
};

struct Mount {
  std::string volume;
  std::string path;
  bool read_only = false;
};

struct Rendezvous {
  std::string backend = "c10d";  // c10d (cohort's embedded store on the first node) | etcd
  std::string endpoint;          // etcd: host:port[,host:port]; c10d: empty = first node
  int port = 29400;              // c10d store port on the first node
};

struct ArraySource {
  std::string range;        // "0-99" or "0-99:2" (step)
  std::string manifest;     // CSV path: one element per row, columns become env variables
  std::string from_sql;     // a SELECT whose rows are the elements
  std::string db;           // sqlite:///path | postgresql://user@host:port/db
  int concurrency = 0;      // at most this many elements at once (0: no limit)
  std::vector<std::string> columns;  // a manifest without header row: the variable names
  std::string target_by;    // with targets: the column naming each element's target, or
                            // "round-robin" (the default)
  bool empty() const { return range.empty() && manifest.empty() && from_sql.empty(); }
};

struct JobSpec {
  std::string name;
  std::string image;
  std::string entrypoint;     // a program, a .py file, or (module) a Python module
  bool module = false;        // `module:` in the spec: entrypoint runs as python -m
  std::vector<std::string> args;
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  Resources resources;
  std::map<std::string, std::string> env;
  std::vector<Volume> volumes;
  std::vector<Mount> mounts;
  int max_restarts = 0;
  std::string queue;
  std::string priority;
  Rendezvous rdzv;
  ArraySource array;
  Placement placement;
  MetricsSpec metrics;
  KubernetesSpec kubernetes;
  std::vector<Target> targets;
  // Backend ("local", "slurm", "kubernetes") -> its override, a YAML map as text. The spec
  // a backend runs is SpecForBackend's.
  std::map<std::string, std::string> overrides;

  std::string NnodesText() const;  // "2" or "1:4"
};

// Parses and validates `yaml` (from `source`, used in messages). On success `problems` is
// empty; otherwise it lists every problem found and the returned spec is partial.
JobSpec ParseJobSpec(const std::string& yaml, std::vector<Problem>* problems);
Result<JobSpec> LoadJobSpec(const std::string& path, std::vector<Problem>* problems);

// The spec as `backend` runs it: its override (if any) merged over the spec, validated
// again (problems name "overrides.<backend>"), without `overrides`. "k8s" is "kubernetes".
JobSpec SpecForBackend(const JobSpec& spec, const std::string& backend,
                       std::vector<Problem>* problems);

// `nnodes` as written ("2", "1:4") -> (min, max); an error that says what is wrong.
Result<std::pair<int, int>> ParseNnodesText(std::string_view text);

// Makes a relative file entrypoint (a .py file, or a path with '/') absolute against
// `base_dir` (the spec's directory) when that file exists there, for backends whose nodes
// share this machine's files (local, Slurm); nothing else changes. In an image
// (Kubernetes) a relative path stays the image's.
void ResolveEntrypointPath(JobSpec* spec, const std::string& base_dir);

// Serializes a spec back to YAML (stored in the job history, shown by `status`).
std::string JobSpecToYaml(const JobSpec& spec);

// "8Gi" -> 8 GiB, "500M" -> 500e6, "1024" -> 1024 bytes; nullopt when not a quantity.
std::optional<int64_t> ParseMemoryQuantity(const std::string& text);

// For backends that run without containers (local, slurm): every volume must be a host
// path, and every mount at its volume's own path. `runner` names the backend in messages.
void CheckHostPathVolumes(const JobSpec& spec, const std::string& runner,
                          std::vector<Problem>* problems);

// `args` with ${NAME} and $NAME replaced by vars[NAME] where `vars` has NAME; every other
// '$' is left as written, for the program or its shell (`sh -c 'echo $RANK'` still works).
// $$NAME (or $${NAME}) with NAME in `vars` gives the text $NAME; other $$ stay as they are.
// Nothing comes from the submitting machine's environment: a spec means the same on every
// backend.
std::vector<std::string> ExpandArgs(const std::vector<std::string>& args,
                                    const std::map<std::string, std::string>& vars);

// The worker arguments of a job or array element (`element_env`, nullptr: not an array):
// ExpandArgs over the spec's env and the element's variables. Every backend calls this.
std::vector<std::string> ElementArgs(const JobSpec& spec,
                                     const std::map<std::string, std::string>* element_env);

// Appends a problem for each field `backend` (local, slurm, kubernetes) can never honour,
// whatever the machine or cluster: extended resources on local, node selectors on local
// and Slurm. The one table of what each backend can place; the backends and pipeline
// validation ask it.
void CheckUnsupportedFields(const JobSpec& spec, const std::string& backend,
                            std::vector<Problem>* problems);

// Formats problems one per line, for messages.
std::string FormatProblems(const std::vector<Problem>& problems);

}  // namespace cohort::launch
