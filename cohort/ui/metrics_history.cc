// Jobs' metrics histories as chart series (metrics_history.h).
// Thread-safety: pure functions over files.
#include "cohort/ui/metrics_history.h"

#include <fmt/format.h>

#include <filesystem>

#include "cohort/base/strings.h"
#include "cohort/metrics/exporter.h"

namespace cohort::ui {
namespace {

namespace fs = std::filesystem;

// The rank of a "rank<R>.jsonl" file; nullopt for any other name.
std::optional<int64_t> HistoryRank(const fs::path& p) {
  const std::string name = p.filename().string();
  if (p.extension() != ".jsonl" || name.rfind("rank", 0) != 0) return std::nullopt;
  return ParseInt64(std::string_view(name).substr(4, name.size() - 4 - 6));
}

// The lowest rank's history file in `dir`.
std::string LowestRankFile(const fs::path& dir) {
  std::string best;
  int64_t best_rank = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto rank = HistoryRank(entry.path());
    if (rank && (best.empty() || *rank < best_rank)) {
      best = entry.path().string();
      best_rank = *rank;
    }
  }
  return best;
}

}  // namespace

std::string FindRankHistory(const std::string& log_dir) {
  std::error_code ec;
  if (log_dir.empty() || !fs::is_directory(log_dir, ec)) return "";
  fs::path best;
  bool best_has_rank0 = false;
  fs::file_time_type best_time{};
  fs::recursive_directory_iterator it(log_dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() > 6) it.disable_recursion_pending();
    const auto rank = HistoryRank(it->path());
    if (!rank) continue;
    const bool rank0 = *rank == 0;
    const auto time = fs::last_write_time(it->path(), ec);
    if (best.empty() || (rank0 && !best_has_rank0) ||
        (rank0 == best_has_rank0 && time > best_time)) {
      best = it->path().parent_path();
      best_has_rank0 = rank0;
      best_time = time;
    }
  }
  return best.empty() ? "" : LowestRankFile(best);
}

JobCurves CurvesOf(const std::vector<launch::JobRecord>& jobs) {
  JobCurves out;
  for (const auto& job : jobs) {
    const std::string path = FindRankHistory(job.log_dir);
    if (path.empty()) continue;
    const auto points = metrics::ReadRankHistory(path, 4 << 20);
    if (points.empty()) continue;
    Series loss{fmt::format("job {} {}", job.id, job.name), {}};
    Series speed{loss.name, {}};
    for (const auto& p : points) {
      const auto step = metrics::MetricValue(p.metrics, "cohort_train_step");
      const auto value = metrics::MetricValue(p.metrics, "cohort_train_loss");
      if (step && value) loss.points.emplace_back(*step, *value);
      if (auto sps = metrics::MetricValue(p.metrics, "cohort_train_samples_per_second")) {
        speed.points.emplace_back(p.time - points.front().time, *sps);
      }
    }
    if (!loss.points.empty()) out.loss.push_back(std::move(loss));
    if (!speed.points.empty()) out.speed.push_back(std::move(speed));
  }
  return out;
}

}  // namespace cohort::ui
