// `cohort pipeline run | resume | status | list | export | validate`: multi-step workflows
// (cohort/pipeline) run locally with their state in $COHORT_HOME/pipelines.db, or exported
// as Argo Workflows. Thread-safety: runs on the main thread (the executor starts its own
// step threads).
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

int PipelineCommand(const std::vector<std::string>& args);

}  // namespace cohort::cli
