// AgentArgv (see agent_command.h). Thread-safety: pure function.
#include "cohort/launch/agent_command.h"

namespace cohort::launch {

std::vector<std::string> AgentArgv(const JobSpec& spec, const std::string& cohort_bin,
                                   const AgentPlan& plan,
                                   const std::optional<std::vector<std::string>>& program_args) {
  std::vector<std::string> argv = {cohort_bin,         "run",
                                   "--nnodes",
                                   plan.nnodes.empty() ? spec.NnodesText() : plan.nnodes,
                                   "--nproc-per-node", std::to_string(spec.nproc_per_node),
                                   "--max-restarts",   std::to_string(spec.max_restarts)};
  auto flag = [&](const char* name, const std::string& value) {
    if (!value.empty()) argv.insert(argv.end(), {name, value});
  };
  flag("--rdzv-backend", plan.rdzv_backend);
  flag("--rdzv-endpoint", plan.rdzv_endpoint);
  flag("--rdzv-id", plan.rdzv_id);
  for (const std::string& conf : plan.rdzv_conf) flag("--rdzv-conf", conf);
  flag("--log-dir", plan.log_dir);
  if (spec.metrics.enabled()) {
    flag("--metrics-port", std::to_string(spec.metrics.port));
    flag("--metrics-host", spec.metrics.host.empty() ? plan.metrics_host : spec.metrics.host);
  }
  if (spec.module) argv.push_back("--module");  // cohort run: python -m <entrypoint>
  argv.insert(argv.end(), {"--", spec.entrypoint});
  if (program_args) argv.insert(argv.end(), program_args->begin(), program_args->end());
  return argv;
}

}  // namespace cohort::launch
