// The training curves of jobs for `cohort ui`: each job's metrics history (the rank<R>.jsonl
// lines its workers export under the job's log directory, exporter.h) as chart series:
// loss by step, and samples/s by seconds since the first sample. The lowest rank that has
// a history stands for the job (data parallel: every rank sees the same loss curve shape).
//
// Thread-safety: pure functions over files.
#pragma once

#include <string>
#include <vector>

#include "cohort/launch/job_db.h"
#include "cohort/ui/pages.h"
#include "cohort/ui/svg.h"

namespace cohort::ui {

// The directory holding a job's newest metrics histories (with rank 0 when any has it), or
// "" when the job exported none.
std::string FindMetricsDir(const std::string& log_dir);

// One series per job that has points, named "job <id> <name>".
std::vector<Series> LossCurves(const UiContext& c, const std::vector<launch::JobRecord>& jobs);
std::vector<Series> SpeedCurves(const UiContext& c, const std::vector<launch::JobRecord>& jobs);

}  // namespace cohort::ui
