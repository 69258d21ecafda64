// Host and accelerator utilisation for the agent's metrics and dashboard:
//  - per worker (from /proc/<pid>): CPU % since the previous sample, resident memory, bytes
//    read and written through syscalls (files and sockets: /proc/<pid>/io rchar/wchar);
//  - the node: CPU %, memory used/total (/proc/stat, /proc/meminfo), network bytes
//    received/sent on non-loopback interfaces (/proc/net/dev);
//  - NVIDIA GPUs through NVML loaded at run time (dlopen of libnvidia-ml.so.1, or
//    $COHORT_NVML_LIBRARY): utilisation and memory per device. No NVML (no driver, no GPU)
//    is reported as absent with the reason, never as a failure.
// An unreadable /proc entry (a worker that just exited, a hardened /proc) marks that value
// unavailable with the reason; sampling never throws and never fails the job.
//
// Thread-safety: a SystemSampler is used by one thread at a time (the HTTP server
// serializes its handlers on it with a mutex).
#pragma once

#include <sys/types.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cohort/metrics/registry.h"

namespace cohort::metrics {

struct WorkerProcess {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
};

class SystemSampler {
 public:
  SystemSampler();
  ~SystemSampler();

  // Samples the workers, the node and the GPUs; also records them as gauges in `registry`
  // (cohort_worker_cpu_percent{rank}, cohort_node_*, cohort_gpu_*). Returns
  // {"workers":[...], "node":{...}, "gpus":{"available":bool,"reason":...,"devices":[...]}}.
  nlohmann::json Sample(const std::vector<WorkerProcess>& workers, Registry& registry);

  // For tests: read /proc from another root (e.g. a directory with fake entries).
  void set_proc_root(std::string root) { proc_ = std::move(root); }

 private:
  struct Nvml;
  struct CpuMark {
    double ticks = 0;
    double time = 0;
  };
  nlohmann::json SampleWorker(const WorkerProcess& w, double now);
  nlohmann::json SampleNode(double now);
  nlohmann::json SampleGpus();

  std::string proc_ = "/proc";
  std::map<pid_t, CpuMark> worker_marks_;
  CpuMark node_busy_, node_total_;
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace cohort::metrics
