// Progress of a PyTorch training loop (cohort_torch.report): the gauges cohort-train sets
// (cohort_train_step, _loss, _samples_per_second, _samples_total), exported to the agent like
// every worker metric (metrics/exporter.h: rank<R>.json), so /job, `cohort top` and
// `cohort bench scaling` show a PyTorch job as they show cohort-train; and, when a TensorBoard
// directory is named, the same numbers as scalars of rank 0's event file.
//
// Thread-safety: Report may be called from any thread (one lock); it never fails the job:
// a TensorBoard write error is logged once and that output stops.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::torch_backend {

struct ProgressReport {
  std::optional<int64_t> step;     // optimizer steps done
  std::optional<double> loss;      // the latest loss (or a window mean)
  std::optional<double> samples;   // samples this rank trained since its previous report
  std::optional<double> epoch;     // epochs done (may be fractional)
  std::string tensorboard_dir;     // empty: COHORT_TENSORBOARD_DIR (settings.h), else none
};

// Records `r`; samples per second are measured over windows of at least one second.
// Starts the worker's metrics exporter when the agent offers one (COHORT_METRICS_DIR).
void Report(const ProgressReport& r);

}  // namespace cohort::torch_backend
