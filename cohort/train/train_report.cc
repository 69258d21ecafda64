// Reporter, MetricsWriter and Hms (see train_report.h). Thread-safety: single owner thread.
#include "cohort/train/train_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cohort/base/exit_codes.h"
#include "cohort/metrics/registry.h"

namespace cohort::train {

std::string Hms(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m{:02d}s", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) {
    throw Exit(kExitUsage, fmt::format("cannot create the directory of --metrics-file {}: {}",
                                       path, ec.message()));
  }
  out_.open(path, std::ios::app);
  if (!out_) {
    throw Exit(kExitUsage, fmt::format("cannot open --metrics-file {}: {}", path,
                                       std::strerror(errno)));
  }
}

void MetricsWriter::Write(const nlohmann::json& j) {
  if (!out_.is_open()) return;
  out_ << j.dump() << "\n";
  out_.flush();
}

Reporter::Reporter(const Flags& f, bool leader)
    : f_(f), leader_(leader), file_(leader ? f.metrics_file : "") {
  if (!leader || f.tensorboard_dir.empty()) return;
  auto w = metrics::EventWriter::Open(f.tensorboard_dir);
  if (w.ok()) {
    tensorboard_ = std::move(*w);
  } else {
    Warn(w.status());
  }
}

void Reporter::Progress(const Window& w) {
  auto& reg = metrics::DefaultRegistry();
  const double window = std::max(w.seconds, 1e-9);
  reg.GetGauge("cohort_train_step", "Optimizer steps done").Set(double(w.step));
  reg.GetGauge("cohort_train_epoch", "Epochs done (fractional)")
      .Set(double(w.step) / double(std::max<int64_t>(w.per_epoch, 1)));
  reg.GetGauge("cohort_train_loss", "Mean training loss over the last window, all ranks")
      .Set(w.loss);
  reg.GetGauge("cohort_train_samples_per_second", "Samples this rank trained per second")
      .Set(w.steps * double(f_.batch_size) / window);
  reg.GetGauge("cohort_train_comm_wait_fraction",
               "Share of the last window spent waiting for gradient allreduce")
      .Set(w.comm_wait_seconds / window);
  reg.GetHistogram("cohort_train_step_seconds", "Time per optimizer step (window mean)",
                   metrics::SecondsBuckets())
      .Observe(window / std::max(w.steps, 1.0));
  if (!leader_) return;
  const double sps = w.steps * double(f_.batch_size) * w.world / window;
  const double eta = w.elapsed_seconds / std::max(w.steps_done, 1.0) *
                     double(w.total_steps - w.step);
  fmt::print("epoch {}/{} step {}/{} (batch {}/{}) loss {:.4f} samples/s {:.0f} "
             "comm_wait {:.1f}% eta {}\n",
             w.shown_epoch, f_.epochs, w.step, w.total_steps, w.shown_batch, w.per_epoch,
             w.loss, sps, 100.0 * w.comm_wait_seconds / window, Hms(eta));
  std::fflush(stdout);
  file_.Write({{"event", "step"},
               {"step", w.step},
               {"epoch", w.shown_epoch},
               {"loss", w.loss},
               {"samples_per_s", sps},
               {"comm_wait_s", w.comm_wait_seconds},
               {"window_s", w.seconds},
               {"elapsed_s", w.elapsed_seconds},
               {"world_size", w.world}});
  Scalars(w.step, {{"train/loss", w.loss},
                   {"train/samples_per_s", sps},
                   {"train/comm_wait_fraction", w.comm_wait_seconds / window},
                   {"train/epoch", w.epoch_progress}});
}

void Reporter::End(int64_t step, double accuracy, double train_seconds,
                   double comm_wait_seconds, const std::string& digest) {
  if (!leader_) return;
  file_.Write({{"event", "end"},
               {"step", step},
               {"test_accuracy", accuracy},
               {"train_s", train_seconds},
               {"comm_wait_s", comm_wait_seconds},
               {"param_digest", digest}});
  Scalars(step, {{"test/accuracy", accuracy}});
  tensorboard_.reset();  // flushes and closes
}

void Reporter::Scalars(int64_t step,
                       std::initializer_list<std::pair<const char*, double>> scalars) {
  if (!tensorboard_) return;
  Status st;
  for (const auto& [tag, value] : scalars) {
    if (st.ok()) st = tensorboard_->AddScalar(tag, step, value);
  }
  if (st.ok()) st = tensorboard_->Flush();
  if (!st.ok()) {
    Warn(st);
    tensorboard_.reset();
  }
}

void Reporter::Warn(const Status& st) {
  fmt::print(stderr, "cohort-train: warning: --tensorboard-dir: {}; continuing without it\n",
             st.ToString());
}

}  // namespace cohort::train
