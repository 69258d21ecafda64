// JobSpec: one training job described once (YAML) and run by any backend (local, slurm,
// kubernetes). Parsing collects every problem with the path of its field
// ("resources.memory: ...") instead of stopping at the first, so a user fixes a spec in one
// pass; nothing is submitted while any problem remains.
//
// YAML shape (every field but `name` and `entrypoint` optional):
//   name: fmnist            # [a-z0-9-], <= 63 chars (a Kubernetes/Slurm job name)
//   image: registry/img:tag # required by the kubernetes backend
//   entrypoint: python3     # program run by every worker
//   args: [train.py, --epochs, "3"]
//   nnodes: "1:4"           # N or MIN:MAX
//   nproc_per_node: 2
//   resources: {cpu: 4, memory: 8Gi, gpu: 1, network_devices: [eth0]}
//   env: {KEY: value}
//   volumes: [{name: data, host_path: /mnt/data} | {name: ckpt, nfs: {server: s, path: /x}}
//             | {name: pvc, claim: my-claim}]
//   mounts: [{volume: data, path: /data, read_only: true}]
//   max_restarts: 3
//   queue: default          # Slurm partition, Volcano queue
//   priority: high          # Slurm --nice from a number, else Kubernetes priorityClassName
//   rdzv: {backend: c10d | etcd, endpoint: host:port, port: 29400}
//   array: {range: "0-99", manifest: file.csv, from_sql: "SELECT ...", db: sqlite:///x.db,
//           concurrency: 10}
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
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
  bool empty() const { return range.empty() && manifest.empty() && from_sql.empty(); }
};

struct JobSpec {
  std::string name;
  std::string image;
  std::string entrypoint;
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

  std::string NnodesText() const;  // "2" or "1:4"
};

// Parses and validates `yaml` (from `source`, used in messages). On success `problems` is
// empty; otherwise it lists every problem found and the returned spec is partial.
JobSpec ParseJobSpec(const std::string& yaml, std::vector<Problem>* problems);
Result<JobSpec> LoadJobSpec(const std::string& path, std::vector<Problem>* problems);

// Serializes a spec back to YAML (stored in the job history, shown by `status`).
std::string JobSpecToYaml(const JobSpec& spec);

// "8Gi" -> 8 GiB, "500M" -> 500e6, "1024" -> 1024 bytes; nullopt when not a quantity.
std::optional<int64_t> ParseMemoryQuantity(const std::string& text);

// For backends that run without containers (local, slurm): every volume must be a host
// path, and every mount at its volume's own path. `runner` names the backend in messages.
void CheckHostPathVolumes(const JobSpec& spec, const std::string& runner,
                          std::vector<Problem>* problems);

// Formats problems one per line, for messages.
std::string FormatProblems(const std::vector<Problem>& problems);

}  // namespace cohort::launch
