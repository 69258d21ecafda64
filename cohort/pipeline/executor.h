// The local pipeline executor: runs the steps of a PipelineSpec on this machine, independent
// steps in parallel (at most `parallel` at once), and records everything in the RunDb.
//
// Protocol of one run (Execute):
//   1. Every step gets a row (pending). In topological order, a pending step whose
//      dependencies are all final is decided: a failed/not-run/cancelled dependency makes
//      it `not-run`; a false `when` makes it `skipped`; a cached step whose key matches an
//      earlier success is `cached` (its outputs reused); otherwise it starts when a slot is
//      free. Skipped dependencies count as done (as in Argo).
//   2. A started step runs on its own thread: a command is spawned in its own process group
//      (output appended to <home>/pipelines/<run>/<step>/output.log, values read back from
//      $COHORT_OUTPUTS/<name>); a `job` is submitted through the launch backend and polled
//      until it ends. A timeout kills the process group (SIGTERM, grace, SIGKILL) or cancels
//      the job; a failed attempt is retried while `retries` lasts. After each attempt the
//      step's process group is killed, and every process carrying the attempt's
//      COHORT_JOB_COOKIE (base/sweeper.h) with it, so nothing it started outlives it, even
//      outside its group; if the executor dies, its sweeper kills what every step left.
//   3. Threads report attempts and results through a queue and an eventfd; the coordinator
//      (the calling thread) prints one progress line per change and writes the RunDb.
//   4. When `cancel_fd` becomes readable (a signalfd for SIGINT/SIGTERM), every running
//      step is stopped, pending ones are marked cancelled and the run ends `cancelled`.
// Resume re-runs a run's steps that did not succeed (failed, not-run, cancelled, pending),
// with the spec text and parameters stored with the run; succeeded/cached/skipped steps keep
// their results and outputs.
//
// Thread-safety: Execute/Resume block the calling thread; one run per call.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/pipeline/pipeline_spec.h"
#include "cohort/pipeline/run_db.h"

namespace cohort::pipeline {

struct ExecutorOptions {
  std::string home;        // COHORT_HOME: pipelines.db, logs, the job database
  std::string cohort_bin;  // for `job` steps on the local backend
  int parallel = 2;
  int cancel_fd = -1;      // readable: stop the run (-1: never)
  double kill_grace_s = 5;
  std::function<void(const std::string&)> progress;  // one line per state change
};

struct RunOutcome {
  int64_t run_id = 0;
  RunState state = RunState::kFailed;  // succeeded | failed | cancelled
};

// Records a new run of `spec` (text `spec_yaml`, read from `spec_path`) with `params`
// (already resolved and validated) and executes it.
Result<RunOutcome> ExecuteNew(const PipelineSpec& spec, const std::string& spec_path,
                              const std::string& spec_yaml,
                              const std::map<std::string, std::string>& params,
                              const ExecutorOptions& options);

// Resumes run `run_id` (see above).
Result<RunOutcome> Resume(int64_t run_id, const ExecutorOptions& options);

// What a step runs, with every template substituted.
struct ResolvedStep {
  std::vector<std::string> argv;  // command steps (a shell string becomes sh -c)
  std::map<std::string, std::string> env;
  std::string job_path;           // job steps: absolute path and substituted text
  std::string job_text;
  std::string backend;
  std::string workdir;            // absolute
  std::vector<std::string> inputs;        // absolute
  std::vector<std::string> output_files;  // absolute
  std::vector<std::string> output_values;
};

// Substitutes `params` and `outputs` (step -> name -> value) into `step`. A reference to an
// output of a step that was skipped or produced none is an error.
Result<ResolvedStep> ResolveStep(const Step& step, const std::string& base_dir,
                                 const std::map<std::string, std::string>& params,
                                 const std::map<std::string, std::map<std::string, std::string>>&
                                     outputs);

// The cache key of a resolved step: a hash of its name, argv/job text, backend, env, working
// directory, declared outputs and the contents of its input files (a missing input is an
// error). 32 hex digits (two 64-bit FNV-1a hashes; it identifies, it does not protect).
Result<std::string> CacheKey(const std::string& step_name, const ResolvedStep& step);

}  // namespace cohort::pipeline
