// Reporter: what cohort-train tells about its progress: rank 0's console line (`epoch E/N
// step S/T ... eta`), its JSON lines (--metrics-file, through MetricsWriter) and TensorBoard
// scalars (--tensorboard-dir), and every rank's own gauges for the agent's /metrics
// (metrics/exporter.h). Optional outputs fail soft: a TensorBoard write error warns once and
// training goes on. Hms formats a duration for those lines.
//
// Thread-safety: a Reporter (and its MetricsWriter) is used by one thread, the Trainer's.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "cohort/metrics/tensorboard.h"
#include "cohort/train/trainer.h"

namespace cohort::train {

// "1h02m03s", "4m05s", "6s"; "?" for a negative or infinite duration.
std::string Hms(double seconds);

// Appends JSON lines to a file (flushed after each); does nothing for an empty path.
class MetricsWriter {
 public:
  // Creates the file's directory, as for --checkpoint-dir and --tensorboard-dir; throws
  // Exit(kExitUsage) when the directory or the file cannot be made.
  explicit MetricsWriter(const std::string& path);
  void Write(const nlohmann::json& j);

 private:
  std::ofstream out_;
};

// Rank 0's console line, JSON metrics record and TensorBoard scalars, and every rank's own
// gauges for the agent's /metrics (exporter.h).
class Reporter {
 public:
  Reporter(const Flags& f, bool leader);

  struct Window {
    int64_t step, total_steps, per_epoch, shown_epoch, shown_batch;
    double epoch_progress;  // epochs done, fractional
    double loss, seconds, comm_wait_seconds, elapsed_seconds;
    double steps;       // in this window
    double steps_done;  // since this process started training
    int world;
  };

  void Progress(const Window& w);
  void End(int64_t step, double accuracy, double train_seconds, double comm_wait_seconds,
           const std::string& digest);

 private:
  void Scalars(int64_t step, std::initializer_list<std::pair<const char*, double>> scalars);
  static void Warn(const Status& st);

  const Flags& f_;
  const bool leader_;
  MetricsWriter file_;
  std::unique_ptr<metrics::EventWriter> tensorboard_;
};

}  // namespace cohort::train
