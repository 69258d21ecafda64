// MetricsServer: the agent's HTTP endpoint (--metrics-port), on cpp-httplib.
//   GET /metrics      Prometheus text: the agent's registry, every local rank's exported
//                     snapshot (label rank="R"), and /proc + NVML gauges sampled per scrape
//   GET /api/state    JSON for the dashboard: the agent's state (from the provider), each
//                     rank's latest metrics, utilisation, recent events (?since=<seq>)
//   GET /api/history  each rank's samples/s, loss and step over time (the chart)
//   GET /api/job      the whole job (every agent of the job's directory, job_view.h), when
//                     the server was given `job`; ?rank=R: the log lines of rank R
//   GET /             the live dashboard (dashboard_page.cc), which polls /api/state
//   GET /job          the job-wide page (job_page.cc), which polls /api/job
// Monitoring never fails the job: a port in use is an error from Start() with a clear
// message, and the caller (cohort run) goes on without the endpoint.
//
// Thread-safety: Start/Stop from the owning thread; handlers run on httplib's pool and
// take `mu_`, which guards the sampler and the last system sample; providers must be
// thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/base/status.h"
#include "cohort/metrics/registry.h"
#include "cohort/metrics/system.h"

namespace httplib {
class Server;
}

namespace cohort::metrics {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;                       // 0: any free port (see port())
  std::string metrics_dir;            // where workers export rank<R>.json
  Registry* registry = nullptr;       // default: DefaultRegistry()
  EventLog* events = nullptr;         // restarts, failures, log lines
  std::function<nlohmann::json()> state;                     // the agent's own state
  std::function<std::vector<WorkerProcess>()> workers;        // live worker processes
  // The job-wide view (/api/job[?rank=R]: the log lines of rank R only).
  std::function<nlohmann::json(int rank)> job;
};

class MetricsServer {
 public:
  static Result<std::unique_ptr<MetricsServer>> Start(ServerOptions options);
  ~MetricsServer();
  int port() const { return port_; }
  void Stop();

  // The bodies of the endpoints (also used by tests without HTTP).
  std::string MetricsText() COHORT_EXCLUDES(mu_);
  nlohmann::json State(uint64_t since) COHORT_EXCLUDES(mu_);
  // Each rank's exported history: [time, samples/s, loss, step] points (/api/history).
  nlohmann::json History();

 private:
  explicit MetricsServer(ServerOptions options);
  ServerOptions o_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  Mutex mu_;
  SystemSampler sampler_ COHORT_GUARDED_BY(mu_);
  nlohmann::json last_system_ COHORT_GUARDED_BY(mu_);
};

// The dashboard page and the job-wide page (HTML + JS, no external resources).
extern const char kDashboardPage[];
extern const char kJobPage[];

}  // namespace cohort::metrics
