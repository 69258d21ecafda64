// Worker metrics export (see exporter.h). Thread-safety: as documented there; g_mu guards
// g_exporter, and an Exporter's mu_ guards its stop flag. The rest of an Exporter's state
// (last_history_, stopping_, warned_) is touched only by WriteOnce, on the export thread
// and then, after it has been joined, by Stop.
#include "cohort/metrics/exporter.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"

namespace cohort::metrics {
namespace {

constexpr const char* kLog = "metrics";


class Exporter {
 public:
  Exporter(std::string dir, int rank, std::chrono::milliseconds interval, double history_s)
      : dir_(std::move(dir)), rank_(rank), written_rank_(rank), interval_(interval),
        history_s_(history_s) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Exporter() { Stop(); }
  void SetRank(int rank) { rank_.store(rank); }

  void Stop() COHORT_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.SignalAll();
    if (thread_.joinable()) thread_.join();
    stopping_ = true;
    WriteOnce();  // the final numbers, in the history too
  }

 private:
  void Loop() COHORT_EXCLUDES(mu_) {
    pthread_setname_np(pthread_self(), "metrics-export");
    for (;;) {
      WriteOnce();
      MutexLock lock(&mu_);
      const Deadline next = Deadline::After(interval_);
      while (!stop_ && cv_.WaitUntil(&mu_, next)) {
      }
      if (stop_) return;  // Stop writes the final numbers
    }
  }

  // Runs without mu_: on the export thread, or in Stop once that thread has ended.
  void WriteOnce() COHORT_EXCLUDES(mu_) {
    const int rank = rank_.load();
    nlohmann::json snap = {{"time", WallSeconds()}, {"rank", rank}, {"pid", ::getpid()},
                           {"metrics", DefaultRegistry().ToJson()}};
    const std::string base = fmt::format("{}/rank{}", dir_, rank);
    const std::string line = snap.dump();
    bool ok = true;
    {
      std::ofstream tmp(base + ".json.tmp", std::ios::trunc);
      tmp << line << "\n";
      ok = ok && static_cast<bool>(tmp);
    }
    std::error_code ec;
    if (ok) std::filesystem::rename(base + ".json.tmp", base + ".json", ec);
    ok = ok && !ec;
    if (ok && rank != written_rank_) {
      // The old rank's file, unless another worker (which now has that rank) wrote it.
      const std::string old = fmt::format("{}/rank{}.json", dir_, written_rank_);
      std::ifstream in(old);
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_object() && j.value("pid", 0) == ::getpid()) std::filesystem::remove(old, ec);
      written_rank_ = rank;
    }
    const double now = snap["time"].get<double>();
    if (now - last_history_ >= history_s_ || stopping_) {
      last_history_ = now;
      std::ofstream history(base + ".jsonl", std::ios::app);
      history << line << "\n";
      ok = ok && static_cast<bool>(history);
    }
    if (!ok && !warned_) {
      warned_ = true;
      COHORT_LOG_WARN(kLog, "cannot write metrics under {} (monitoring only; training goes on)",
                      dir_);
    }
  }

  const std::string dir_;
  std::atomic<int> rank_;  // SetRank (any thread), read by WriteOnce
  int written_rank_;       // the rank of the last snapshot file written
  const std::chrono::milliseconds interval_;
  const double history_s_;
  double last_history_ = 0;
  bool stopping_ = false;
  Mutex mu_;
  CondVar cv_;  // signalled by Stop
  bool stop_ COHORT_GUARDED_BY(mu_) = false;
  bool warned_ = false;
  std::thread thread_;
};

Mutex g_mu;
Exporter* g_exporter COHORT_GUARDED_BY(g_mu) = nullptr;

}  // namespace

bool StartWorkerExporter(std::chrono::milliseconds interval) {
  MutexLock lock(&g_mu);
  if (g_exporter) return true;
  Result<WorkerEnv> env = ReadWorkerEnv();
  if (!env.ok() || env->metrics_dir.empty()) return false;
  std::error_code ec;
  std::filesystem::create_directories(env->metrics_dir, ec);
  const double history_s = env->metrics_history_s > 0 ? env->metrics_history_s : 5.0;
  g_exporter = new Exporter(env->metrics_dir, env->rank, interval, history_s);
  std::atexit([] { StopWorkerExporter(); });
  return true;
}

void SetExportedRank(int rank) {
  MutexLock lock(&g_mu);
  if (g_exporter) g_exporter->SetRank(rank);
}

void StopWorkerExporter() {
  MutexLock lock(&g_mu);
  if (!g_exporter) return;
  g_exporter->Stop();
  delete g_exporter;
  g_exporter = nullptr;
}

std::vector<RankSnapshot> ReadRankSnapshots(const std::string& dir) {
  std::vector<RankSnapshot> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank", 0) != 0 || entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    RankSnapshot s;
    s.rank = j.value("rank", -1);
    s.time = j.value("time", 0.0);
    s.metrics = j.value("metrics", nlohmann::json::array());
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const RankSnapshot& a, const RankSnapshot& b) { return a.rank < b.rank; });
  return out;
}

std::vector<RankSnapshot> ReadRankHistory(const std::string& path, size_t max_bytes) {
  std::vector<RankSnapshot> points;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return points;
  const auto size = static_cast<size_t>(in.tellg());
  in.seekg(static_cast<std::streamoff>(size > max_bytes ? size - max_bytes : 0));
  std::string line;
  if (size > max_bytes) std::getline(in, line);  // skip the partial first line
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    points.push_back({j.value("rank", -1), j.value("time", 0.0),
                      j.value("metrics", nlohmann::json::array())});
  }
  return points;
}

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

std::vector<std::vector<RankSnapshot>> ReadRankHistories(const std::string& dir,
                                                         size_t max_bytes) {
  std::vector<std::vector<RankSnapshot>> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".jsonl") continue;
    std::vector<RankSnapshot> points = ReadRankHistory(entry.path().string(), max_bytes);
    if (!points.empty()) out.push_back(std::move(points));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a[0].rank < b[0].rank; });
  return out;
}

}  // namespace cohort::metrics
