// Report (see progress.h). Thread-safety: one mutex over the window and the event writer.
#include "cohort/torch/progress.h"

#include <chrono>
#include <memory>

#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/base/settings.h"
#include "cohort/base/worker_env.h"
#include "cohort/metrics/exporter.h"
#include "cohort/metrics/registry.h"
#include "cohort/metrics/tensorboard.h"

namespace cohort::torch_backend {
namespace {

struct Window {
  Mutex mu;
  SteadyClock::time_point started COHORT_GUARDED_BY(mu) = SteadyClock::now();
  double samples COHORT_GUARDED_BY(mu) = 0;
  double total COHORT_GUARDED_BY(mu) = 0;
  bool exporting COHORT_GUARDED_BY(mu) = false;
  bool tensorboard_tried COHORT_GUARDED_BY(mu) = false;
  std::unique_ptr<metrics::EventWriter> tensorboard COHORT_GUARDED_BY(mu);
};

Window& TheWindow() {
  static Window* w = new Window();  // lives for the process (the exporter reads gauges)
  return *w;
}

bool Leader() {
  auto env = ReadWorkerEnv();
  return !env.ok() || env->rank == 0;
}

}  // namespace

void Report(const ProgressReport& r) {
  auto& reg = metrics::DefaultRegistry();
  Window& w = TheWindow();
  MutexLock lock(&w.mu);
  if (!w.exporting) {
    metrics::StartWorkerExporter();  // no-op without COHORT_METRICS_DIR
    w.exporting = true;
  }
  if (r.step) reg.GetGauge("cohort_train_step", "Optimizer steps done").Set(double(*r.step));
  if (r.epoch) reg.GetGauge("cohort_train_epoch", "Epochs done (fractional)").Set(*r.epoch);
  if (r.loss) {
    reg.GetGauge("cohort_train_loss", "Mean training loss over the last window, all ranks")
        .Set(*r.loss);
  }
  std::optional<double> rate;
  if (r.samples && *r.samples > 0) {
    w.samples += *r.samples;
    w.total += *r.samples;
    reg.GetGauge("cohort_train_samples_total", "Samples this rank trained").Set(w.total);
    const double elapsed = SecondsSince(w.started);
    if (elapsed >= 1.0) {
      rate = w.samples / elapsed;
      reg.GetGauge("cohort_train_samples_per_second", "Samples this rank trained per second")
          .Set(*rate);
      w.samples = 0;
      w.started = SteadyClock::now();
    }
  }
  // TensorBoard: rank 0 writes, at the steps it reports.
  std::string dir = r.tensorboard_dir;
  if (dir.empty()) dir = settings::kTensorboardDir.Get();
  if (dir.empty() || !r.step) return;
  if (!w.tensorboard_tried) {
    w.tensorboard_tried = true;
    if (Leader()) {
      auto writer = metrics::EventWriter::Open(dir);
      if (writer.ok()) {
        w.tensorboard = std::move(*writer);
      } else {
        COHORT_LOG_WARN("train", "no TensorBoard output: {}", writer.status().message());
      }
    }
  }
  if (!w.tensorboard) return;
  Status st;
  if (r.loss) st = w.tensorboard->AddScalar("train/loss", *r.step, *r.loss);
  if (st.ok() && rate) st = w.tensorboard->AddScalar("train/samples_per_second", *r.step, *rate);
  if (st.ok()) st = w.tensorboard->Flush();
  if (!st.ok()) {
    COHORT_LOG_WARN("train", "TensorBoard output stopped: {}", st.message());
    w.tensorboard.reset();
  }
}

}  // namespace cohort::torch_backend
