// The names of the environment variables cohort gives the processes of a submitted job, an
// array element and a pipeline step (docs/jobs.md, docs/pipelines.md), spelled once: the
// backends, the array expansion and the pipeline executor and Argo export set them from here.
// (What `cohort run` gives its workers is base/worker_env.h.)
// Thread-safety: constants only.
#pragma once

namespace cohort::launch {

// Every job of the local and Slurm backends: its id in the job history, and its name.
inline constexpr char kEnvJobId[] = "COHORT_JOB_ID";
inline constexpr char kEnvJobName[] = "COHORT_JOB_NAME";

// Every array element (array.h, targets.h): what all the array's variables start with, the
// element's position (0-based), the array's size, the value from array.range, and the
// element's target (arrays over targets).
inline constexpr char kEnvArrayPrefix[] = "COHORT_ARRAY_";
inline constexpr char kEnvArrayIndex[] = "COHORT_ARRAY_INDEX";
inline constexpr char kEnvArraySize[] = "COHORT_ARRAY_SIZE";
inline constexpr char kEnvArrayTaskId[] = "COHORT_ARRAY_TASK_ID";
inline constexpr char kEnvArrayTarget[] = "COHORT_ARRAY_TARGET";

// Every pipeline step: the directory its output values go to, the pipeline's name, the run's
// id, the step's name and attempt, the pipeline spec's directory, and the pipeline's
// workspace (when it has one).
inline constexpr char kEnvOutputs[] = "COHORT_OUTPUTS";
inline constexpr char kEnvPipeline[] = "COHORT_PIPELINE";
inline constexpr char kEnvPipelineRun[] = "COHORT_PIPELINE_RUN";
inline constexpr char kEnvPipelineStep[] = "COHORT_PIPELINE_STEP";
inline constexpr char kEnvStepAttempt[] = "COHORT_STEP_ATTEMPT";
inline constexpr char kEnvSpecDir[] = "COHORT_SPEC_DIR";
inline constexpr char kEnvWorkspace[] = "COHORT_WORKSPACE";

}  // namespace cohort::launch
