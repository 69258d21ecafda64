// Export of a PipelineSpec as an Argo Workflow (argoproj.io/v1alpha1, kind Workflow), which
// Kubeflow Pipelines' Argo engine also runs:
//   - spec.arguments.parameters: every pipeline parameter with its value (the default, or
//     the -p override) and its enum;
//   - one DAG template `cohort-dag` (the entrypoint) whose tasks carry `dependencies` and `when` (the condition in
//     Argo's syntax: {{workflow.parameters.X}}, {{tasks.S.outputs.parameters.O}});
//   - one container template per step: the image, the command as given (a shell string as
//     [sh, -c, ...]; a `job` step as `cohort submit --wait [--backend B] --set ... JOB` (the
//     parameters its spec reads); B left out when local), env,
//     retryStrategy.limit = retries, activeDeadlineSeconds = timeout, output values as
//     output parameters read from /tmp/outputs/<name> (COHORT_OUTPUTS=/tmp/outputs), and
//     outputs of other steps passed in as input parameters;
//   - the pipeline's workspace (pipeline_spec.h: a PersistentVolumeClaim) mounted at its
//     path in every step, so that files one step writes reach the next ($COHORT_WORKSPACE);
//   - a serviceAccountName, and with `rbac` the ServiceAccount, Role and RoleBinding that let
//     the steps' pods run `cohort submit --backend kubernetes` (the objects cohort applies,
//     watches and deletes) and report their outputs to Argo (workflowtaskresults).
// The YAML a user applies comes from launch::JsonToYaml (yaml_emit.h).
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/pipeline/pipeline_spec.h"

namespace cohort::pipeline {

struct ArgoOptions {
  std::string image = "cohort:latest";
  std::string service_account;  // empty: the namespace default (with rbac: <pipeline>-cohort)
  bool rbac = false;            // ArgoRbacObjects are applied with the workflow
  std::string workspace_claim;  // overrides the spec's workspace.claim (or adds a workspace)
  std::string workspace_path;   // overrides workspace.path
};

// The service account the workflow's pods run as ("" : the namespace's default).
std::string ArgoServiceAccount(const PipelineSpec& spec, const ArgoOptions& options);

// With options.rbac: the ServiceAccount, Role and RoleBinding (in the workflow's namespace)
// the steps need; empty otherwise.
std::vector<nlohmann::json> ArgoRbacObjects(const PipelineSpec& spec, const ArgoOptions& options);

// The steps that submit jobs to Kubernetes from their pod (they need a service account that
// may: ArgoRbacObjects).
std::vector<std::string> StepsSubmittingToKubernetes(const PipelineSpec& spec);

// The Workflow object; `params` are the resolved parameter values.
nlohmann::json ExportArgo(const PipelineSpec& spec, const std::map<std::string, std::string>& params,
                          const ArgoOptions& options);

}  // namespace cohort::pipeline
