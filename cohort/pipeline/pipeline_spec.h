// PipelineSpec: a multi-step workflow described in YAML, run by the local executor
// (executor.h) or exported for Argo Workflows (argo.h). Parsing collects every problem with
// the path of its field ("steps[2].when: unknown parameter 'runtim' (did you mean
// 'runtime'?)") instead of stopping at the first; nothing runs while any problem remains.
//
// YAML shape:
//   name: fmnist                       # [a-z0-9-]
//   parameters:
//     runtime: {type: string, default: local, enum: [local, slurm]}
//     steps:   {type: int, default: 200}
//   steps:
//     - name: prepare
//       command: [sh, prepare.sh, "{{params.data}}"]   # argv, or one string run by sh -c
//       env: {KEY: "{{params.x}}"}
//       workdir: sub/dir                # default: the directory of the spec file
//       inputs: [prepare.sh]            # files whose contents enter the cache key
//       outputs: [samples, {file: data/train.gz}]  # values ($COHORT_OUTPUTS/samples) / files
//       retries: 2
//       timeout: 600                    # seconds per attempt
//       cache: true
//     - name: train
//       job: train.yaml                 # a job spec for `cohort submit`
//       backend: slurm                  # local (default) | slurm | kubernetes
//       depends: [prepare]
//       when: "{{params.runtime}} == 'slurm' && {{steps.prepare.outputs.samples}} > 0"
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/launch/job_spec.h"
#include "cohort/pipeline/condition.h"

namespace cohort::pipeline {

using launch::Problem;

enum class ParamType { kString, kInt, kFloat, kBool };
const char* ParamTypeName(ParamType type);

struct Parameter {
  std::string name;
  ParamType type = ParamType::kString;
  bool has_default = false;
  std::string default_value;             // as written (a bool as "true"/"false")
  std::vector<std::string> enum_values;  // empty: any value of the type
};

struct Step {
  std::string name;
  std::vector<std::string> command;  // argv; empty when `shell` or `job` is used
  std::string shell;                 // a command string run by /bin/sh -c
  std::string job;                   // path of a job spec (relative to the spec's directory)
  std::string backend = "local";     // for `job`
  std::vector<std::string> depends;
  std::map<std::string, std::string> env;
  std::string workdir;               // relative to the spec's directory; empty: that directory
  std::vector<std::string> inputs;   // files
  std::vector<std::string> output_values;
  std::vector<std::string> output_files;
  int retries = 0;
  double timeout_s = 0;              // 0: none
  bool cache = false;
  std::string when;                  // as written; empty: always
  std::shared_ptr<const Expr> condition;
};

// `workspace: {claim: NAME, path: /workspace}`: a volume every step shares where steps run
// in separate pods (the Argo export mounts the PersistentVolumeClaim NAME at `path` in every
// step; NAME may be {{params.X}}). Steps see its path as $COHORT_WORKSPACE (`cohort
// pipeline run`: the spec's directory, as every local step shares this machine's files).
struct Workspace {
  std::string claim;
  std::string path = "/workspace";
};

struct PipelineSpec {
  std::string name;
  std::string base_dir;  // the spec file's directory: relative paths start here
  std::vector<Parameter> parameters;
  std::vector<Step> steps;
  std::optional<Workspace> workspace;

  const Step* FindStep(const std::string& name) const;
  const Parameter* FindParam(const std::string& name) const;
};

// Parses and validates `yaml`: structure, names, depends (unknown steps, cycles), templates
// and conditions (unknown parameters, steps, outputs, steps that are not dependencies),
// parameter defaults against their types. `base_dir` anchors relative paths.
PipelineSpec ParsePipelineSpec(const std::string& yaml, const std::string& base_dir,
                               std::vector<Problem>* problems);
Result<PipelineSpec> LoadPipelineSpec(const std::string& path, std::vector<Problem>* problems);

// The values of every parameter: defaults, overridden by `overrides` (-p key=value). Each
// value is checked against its type and enum; a parameter without default must be given.
// Problems name the flag ("-p epochs: 'abc' is not an int").
std::map<std::string, std::string> ResolveParameters(
    const PipelineSpec& spec, const std::map<std::string, std::string>& overrides,
    std::vector<Problem>* problems);

// Checks that need the parameter values: job specs of `job` steps load and validate (after
// substituting parameters). Appends problems.
void CheckJobSteps(const PipelineSpec& spec, const std::map<std::string, std::string>& params,
                   std::vector<Problem>* problems);

// The typed value of a parameter (for conditions).
Value ParamValue(const Parameter& param, const std::string& text);

// Step indices in an order where each step comes after its dependencies (stable: spec
// order among independent steps). A cycle is reported as a problem naming its steps.
std::vector<size_t> TopologicalOrder(const PipelineSpec& spec, std::vector<Problem>* problems);

// True when `ancestor` is reachable from `step` through `depends`.
bool DependsOn(const PipelineSpec& spec, const std::string& step, const std::string& ancestor);

}  // namespace cohort::pipeline
