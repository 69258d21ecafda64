// Metrics registry, Prometheus rendering, the worker exporter, /proc and NVML sampling, and
// the agent's HTTP endpoint (real sockets on 127.0.0.1, port 0).
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/metrics/exporter.h"
#include "cohort/metrics/http_server.h"
#include "cohort/metrics/registry.h"
#include "cohort/metrics/system.h"

namespace cohort::metrics {
namespace {

namespace fs = std::filesystem;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RegistryTest, PrometheusTextFormat) {
  Registry r;
  r.GetCounter("cohort_test_events_total", "Events seen", {{"kind", "a\"b"}}).Add(3);
  r.GetCounter("cohort_test_events_total", "Events seen", {{"kind", "c"}}).Add();
  r.GetCounter("cohort_test_events_total", "ignored", {{"kind", "c"}}).Add(-5);  // counters only go up
  r.GetGauge("cohort_test_level", "A level").Set(2.5);
  auto& h = r.GetHistogram("cohort_test_seconds", "Durations", {0.1, 1});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(7);
  const std::string text = r.PrometheusText();
  EXPECT_TRUE(Contains(text, "# HELP cohort_test_events_total Events seen\n"
                             "# TYPE cohort_test_events_total counter\n"
                             "cohort_test_events_total{kind=\"a\\\"b\"} 3\n"
                             "cohort_test_events_total{kind=\"c\"} 1\n"))
      << text;
  EXPECT_TRUE(Contains(text, "# TYPE cohort_test_level gauge\ncohort_test_level 2.5\n")) << text;
  EXPECT_TRUE(Contains(text, "cohort_test_seconds_bucket{le=\"0.1\"} 1\n"
                             "cohort_test_seconds_bucket{le=\"1\"} 2\n"
                             "cohort_test_seconds_bucket{le=\"+Inf\"} 3\n"
                             "cohort_test_seconds_sum 7.55\n"
                             "cohort_test_seconds_count 3\n"))
      << text;
  // The same name and labels give the same object.
  EXPECT_EQ(&r.GetGauge("cohort_test_level", ""), &r.GetGauge("cohort_test_level", ""));
}

TEST(RegistryTest, SourcesMergeUnderOneHeaderWithRankLabels) {
  Registry agent, w0, w1;
  agent.GetCounter("cohort_agent_restarts_total", "Restarts").Add(1);
  w0.GetGauge("cohort_train_loss", "Loss").Set(0.5);
  w1.GetGauge("cohort_train_loss", "Loss").Set(0.25);
  std::string text = RenderPrometheus(
      {{agent.ToJson(), {}}, {w0.ToJson(), {{"rank", "0"}}}, {w1.ToJson(), {{"rank", "1"}}}});
  EXPECT_TRUE(Contains(text, "# TYPE cohort_train_loss gauge\ncohort_train_loss{rank=\"0\"} 0.5\n"
                             "cohort_train_loss{rank=\"1\"} 0.25\n"))
      << text;
  EXPECT_EQ(text.find("# TYPE cohort_train_loss"), text.rfind("# TYPE cohort_train_loss"));
  EXPECT_TRUE(Contains(text, "cohort_agent_restarts_total 1\n"));
}

TEST(EventLogTest, KeepsTheNewestWithSequenceNumbers) {
  EventLog log(3);
  for (int i = 0; i < 5; ++i) log.Add({{"type", "log"}, {"line", std::to_string(i)}});
  auto all = log.Since(0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0]["line"], "2");
  EXPECT_EQ(all[2]["seq"], 5);
  EXPECT_EQ(log.Since(4).size(), 1u);
}

class TempDir {
 public:
  TempDir() : path(fs::temp_directory_path() / ("cohort-metrics-" + RandomHex(6))) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

TEST(ExporterTest, WorkerSnapshotsReachTheAgent) {
  TempDir dir;
  // The worker environment an agent with --metrics-port gives rank 3 of 4.
  ::setenv(worker_env::kMetricsDir, dir.path.c_str(), 1);
  ::setenv(worker_env::kRank, "3", 1);
  ::setenv(worker_env::kWorldSize, "4", 1);
  ASSERT_TRUE(StartWorkerExporter(std::chrono::milliseconds(20)));
  DefaultRegistry().GetGauge("cohort_train_step", "Step").Set(42);
  StopWorkerExporter();  // writes the final snapshot
  for (const char* name : {worker_env::kMetricsDir, worker_env::kRank, worker_env::kWorldSize}) {
    ::unsetenv(name);
  }
  auto snaps = ReadRankSnapshots(dir.path.string());
  ASSERT_EQ(snaps.size(), 1u);
  EXPECT_EQ(snaps[0].rank, 3);
  bool found = false;
  for (const auto& m : snaps[0].metrics) {
    if (m["name"] == "cohort_train_step") found = m["value"] == 42;
  }
  EXPECT_TRUE(found) << snaps[0].metrics.dump();
  std::ifstream history(dir.path / "rank3.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(history, line)) {
    ASSERT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
    ++lines;
  }
  EXPECT_GE(lines, 1);
  EXPECT_FALSE(StartWorkerExporter());  // no COHORT_METRICS_DIR: nothing to do
}

TEST(SystemSamplerTest, WorkersNodeAndAbsentNvml) {
  ::setenv("COHORT_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  SystemSampler sampler;
  Registry r;
  std::vector<WorkerProcess> me = {{0, 0, ::getpid()}};
  sampler.Sample(me, r);
  volatile double x = 0;
  for (int i = 0; i < 2000000; ++i) x = x + i;  // some CPU between the samples
  auto s = sampler.Sample(me, r);
  ::unsetenv("COHORT_NVML_LIBRARY");
  ASSERT_EQ(s["workers"].size(), 1u);
  EXPECT_TRUE(s["workers"][0].contains("cpu_percent")) << s.dump();
  EXPECT_GT(s["workers"][0].value("rss_bytes", int64_t{0}), 0) << s.dump();
  EXPECT_GT(s["node"].value("mem_total_bytes", int64_t{0}), 0) << s.dump();
  EXPECT_FALSE(s["gpus"]["available"].get<bool>());
  EXPECT_TRUE(Contains(s["gpus"]["reason"].get<std::string>(), "NVML not loaded")) << s.dump();
  EXPECT_TRUE(Contains(r.PrometheusText(), "cohort_gpu_monitoring_available 0"));
  EXPECT_TRUE(Contains(r.PrometheusText(), "cohort_worker_resident_bytes{rank=\"0\"}"));
}

TEST(SystemSamplerTest, UnreadableProcEntriesAreReportedNotFatal) {
  TempDir fake;  // an empty "/proc": nothing readable
  SystemSampler sampler;
  sampler.set_proc_root(fake.path.string());
  Registry r;
  auto s = sampler.Sample({{0, 0, 12345}}, r);
  EXPECT_TRUE(Contains(s["workers"][0].value("error", ""), "cannot read")) << s.dump();
  EXPECT_TRUE(s["node"].contains("cpu_error")) << s.dump();
  EXPECT_TRUE(s["node"].contains("mem_error")) << s.dump();
}

TEST(MetricsServerTest, ServesMetricsStateAndDashboard) {
  TempDir dir;
  Registry registry;
  registry.GetCounter("cohort_agent_restarts_total", "Restarts").Add(2);
  Registry worker;
  worker.GetGauge("cohort_train_loss", "Loss").Set(0.75);
  std::ofstream(dir.path / "rank1.json")
      << nlohmann::json{{"time", 1.0}, {"rank", 1}, {"metrics", worker.ToJson()}}.dump();
  EventLog events(10);
  events.Add({{"type", "restart"}, {"cause", "rank 1 exited with code 3"}});
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.metrics_dir = dir.path.string();
  o.registry = &registry;
  o.events = &events;
  o.state = [] { return nlohmann::json{{"run_id", "job7"}, {"state", "HEALTHY"}}; };
  o.workers = [] { return std::vector<WorkerProcess>{{1, 0, ::getpid()}}; };
  auto server = MetricsServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << "no answer from /metrics";
  EXPECT_EQ(metrics->status, 200);
  EXPECT_TRUE(Contains(metrics->body, "cohort_agent_restarts_total 2\n")) << metrics->body;
  EXPECT_TRUE(Contains(metrics->body, "cohort_train_loss{rank=\"1\"} 0.75\n")) << metrics->body;
  EXPECT_TRUE(Contains(metrics->body, "cohort_worker_resident_bytes{rank=\"1\"}")) << metrics->body;
  auto state = client.Get("/api/state?since=0");
  ASSERT_TRUE(state);
  auto j = nlohmann::json::parse(state->body);
  EXPECT_EQ(j["agent"]["run_id"], "job7");
  EXPECT_EQ(j["ranks"][0]["metrics"]["cohort_train_loss"], 0.75);
  EXPECT_EQ(j["events"][0]["cause"], "rank 1 exited with code 3");
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_TRUE(Contains(page->body, "cohort dashboard"));

  // The same port again: a clear error, not a crash.
  ServerOptions again = o;
  again.port = (*server)->port();
  auto clash = MetricsServer::Start(again);
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(clash.status().message(), "--metrics-port")) << clash.status().message();
  (*server)->Stop();
}

}  // namespace
}  // namespace cohort::metrics
