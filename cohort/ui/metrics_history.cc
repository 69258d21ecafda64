// Jobs' metrics histories as chart series (metrics_history.h).
// Thread-safety: pure functions over files.
#include "cohort/ui/metrics_history.h"

#include <fmt/format.h>

#include <filesystem>
#include <functional>

#include "cohort/metrics/exporter.h"

namespace cohort::ui {
namespace {

namespace fs = std::filesystem;

std::optional<double> MetricValue(const nlohmann::json& metrics, std::string_view name) {
  if (!metrics.is_array()) return std::nullopt;
  for (const auto& m : metrics) {
    if (m.is_object() && m.value("name", "") == name && m.contains("value") &&
        m["value"].is_number()) {
      return m["value"].get<double>();
    }
  }
  return std::nullopt;
}

// The points of `x_of`/`y_of` for the job's lowest rank with a history.
Series JobSeries(const launch::JobRecord& job,
                 const std::function<std::optional<double>(const metrics::RankSnapshot&,
                                                           double first_time)>& x_of,
                 std::string_view y_metric) {
  Series s;
  s.name = fmt::format("job {} {}", job.id, job.name);
  const std::string dir = FindMetricsDir(job.log_dir);
  if (dir.empty()) return s;
  auto histories = metrics::ReadRankHistories(dir, 4 << 20);
  if (histories.empty() || histories[0].empty()) return s;
  const auto& points = histories[0];
  for (const auto& p : points) {
    auto x = x_of(p, points.front().time);
    auto y = MetricValue(p.metrics, y_metric);
    if (x && y) s.points.emplace_back(*x, *y);
  }
  return s;
}

std::vector<Series> Curves(const std::vector<launch::JobRecord>& jobs, bool loss) {
  std::vector<Series> out;
  for (const auto& job : jobs) {
    Series s = loss ? JobSeries(job,
                                [](const metrics::RankSnapshot& p, double) {
                                  return MetricValue(p.metrics, "cohort_train_step");
                                },
                                "cohort_train_loss")
                    : JobSeries(job,
                                [](const metrics::RankSnapshot& p, double first) {
                                  return std::optional<double>(p.time - first);
                                },
                                "cohort_train_samples_per_second");
    if (!s.points.empty()) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::string FindMetricsDir(const std::string& log_dir) {
  std::error_code ec;
  if (log_dir.empty() || !fs::is_directory(log_dir, ec)) return "";
  std::string best;
  bool best_has_rank0 = false;
  fs::file_time_type best_time{};
  fs::recursive_directory_iterator it(log_dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() > 6) it.disable_recursion_pending();
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    if (p.extension() != ".jsonl" || name.rfind("rank", 0) != 0) continue;
    const bool rank0 = name == "rank0.jsonl";
    const auto time = fs::last_write_time(p, ec);
    if (best.empty() || (rank0 && !best_has_rank0) ||
        (rank0 == best_has_rank0 && time > best_time)) {
      best = p.parent_path().string();
      best_has_rank0 = rank0;
      best_time = time;
    }
  }
  return best;
}

std::vector<Series> LossCurves(const UiContext&, const std::vector<launch::JobRecord>& jobs) {
  return Curves(jobs, /*loss=*/true);
}

std::vector<Series> SpeedCurves(const UiContext&, const std::vector<launch::JobRecord>& jobs) {
  return Curves(jobs, /*loss=*/false);
}

}  // namespace cohort::ui
