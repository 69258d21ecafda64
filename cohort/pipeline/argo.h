// Export of a PipelineSpec as an Argo Workflow (argoproj.io/v1alpha1, kind Workflow), which
// Kubeflow Pipelines' Argo engine also runs:
//   - spec.arguments.parameters: every pipeline parameter with its value (the default, or
//     the -p override) and its enum;
//   - one DAG template `cohort-dag` (the entrypoint) whose tasks carry `dependencies` and `when` (the condition in
//     Argo's syntax: {{workflow.parameters.X}}, {{tasks.S.outputs.parameters.O}});
//   - one container template per step: the image, the command as given (a shell string as
//     [sh, -c, ...]; a `job` step as `cohort submit --wait [--backend B] --set ... JOB`; B left out when local), env,
//     retryStrategy.limit = retries, activeDeadlineSeconds = timeout, output values as
//     output parameters read from /tmp/outputs/<name> (COHORT_OUTPUTS=/tmp/outputs), and
//     outputs of other steps passed in as input parameters.
// The YAML a user applies comes from launch::JsonToYaml (yaml_emit.h).
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cohort/pipeline/pipeline_spec.h"

namespace cohort::pipeline {

struct ArgoOptions {
  std::string image = "cohort:latest";
  std::string service_account;  // empty: the namespace default
};

// The Workflow object; `params` are the resolved parameter values.
nlohmann::json ExportArgo(const PipelineSpec& spec, const std::map<std::string, std::string>& params,
                          const ArgoOptions& options);

}  // namespace cohort::pipeline
