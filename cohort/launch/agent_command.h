// AgentArgv: the `cohort run` command line of one node of a job, built from its spec in one
// place for every backend (the local runner, the Slurm script, the Kubernetes pods): the
// torchrun-style flags, the rendezvous the backend arranged, the metrics endpoint, then the
// program and its arguments.
//
// Thread-safety: pure function.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cohort/launch/job_spec.h"

namespace cohort::launch {

// What the backend decides about a node's agent; empty fields are left out.
struct AgentPlan {
  std::string nnodes;                   // --nnodes; "" : the spec's (N or MIN:MAX)
  std::string rdzv_backend;             // c10d | etcd; "" : the agent's own store
  std::string rdzv_endpoint;
  std::string rdzv_id;
  std::vector<std::string> rdzv_conf;   // key=value, one --rdzv-conf each
  std::string log_dir;                  // --log-dir
  std::string metrics_host;             // where metrics listen when the spec names no host
};

// cohort_bin run --nnodes ... --nproc-per-node ... --max-restarts ... [rendezvous]
// [--log-dir] [--metrics-port --metrics-host] -- entrypoint [program_args]. `program_args`
// nullopt leaves them out (the caller appends them, e.g. per array element in a shell).
std::vector<std::string> AgentArgv(const JobSpec& spec, const std::string& cohort_bin,
                                   const AgentPlan& plan,
                                   const std::optional<std::vector<std::string>>& program_args);

}  // namespace cohort::launch
