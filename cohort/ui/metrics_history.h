// The training curves of jobs for `cohort ui`: each job's metrics history (the rank<R>.jsonl
// lines its workers export under the job's log directory, exporter.h) as chart series:
// loss by step, and samples/s by seconds since the first sample. The lowest rank that has
// a history stands for the job (data parallel: every rank sees the same loss curve shape);
// its file is read once for both curves.
//
// Thread-safety: pure functions over files.
#pragma once

#include <string>
#include <vector>

#include "cohort/launch/job_db.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {

// The history file standing for a job: in the newest directory of histories (one with rank
// 0 when any has it), its lowest rank's; "" when the job exported none.
std::string FindRankHistory(const std::string& log_dir);

// One series per job that has points, named "job <id> <name>", in each chart.
struct JobCurves {
  std::vector<Series> loss;   // loss by step
  std::vector<Series> speed;  // samples/s by seconds since the first sample
};
JobCurves CurvesOf(const std::vector<launch::JobRecord>& jobs);

}  // namespace cohort::ui
