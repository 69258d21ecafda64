// The agent's metrics/dashboard HTTP server (see http_server.h).
// Thread-safety: as documented in the header.
#include "cohort/metrics/http_server.h"

#include <httplib.h>
#include <pthread.h>

#include <deque>
#include <system_error>
#include <functional>
#include <thread>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/base/time.h"
#include "cohort/metrics/exporter.h"

namespace cohort::metrics {
namespace {

// httplib serves each connection on a thread of its task queue for as long as the client
// holds it (up to the read timeout per read). A fixed pool of N threads is held by N slow
// or silent clients, and every scrape then waits behind them (100 such connections made 2
// of 4 scrapes miss 5 s against 32 threads). This pool adds a thread whenever a connection
// would otherwise wait, up to kMaxThreads, so a scrape is served at once while fewer than
// that many connections are held; threads stay for the server's lifetime.
class GrowingPool final : public httplib::TaskQueue {
 public:
  static constexpr size_t kMaxThreads = 1024;

  void enqueue(std::function<void()> fn) override {
    MutexLock lock(&mu_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < kMaxThreads) {
      try {
        threads_.emplace_back([this] { Work(); });
      } catch (const std::system_error&) {
        // No thread to be had (a pids cgroup, RLIMIT_NPROC): the connection waits for one
        // of the running threads, as in a fixed pool; the agent goes on.
      }
    }
    work_.Signal();
  }

  void shutdown() override {
    std::vector<std::thread> threads;
    {
      MutexLock lock(&mu_);
      stop_ = true;
      work_.SignalAll();
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        MutexLock lock(&mu_);
        ++idle_;
        while (!stop_ && jobs_.empty()) work_.Wait(&mu_);
        --idle_;
        if (jobs_.empty()) return;  // stopping, nothing left
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  Mutex mu_;
  CondVar work_;
  std::deque<std::function<void()>> jobs_ COHORT_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ COHORT_GUARDED_BY(mu_);
  size_t idle_ COHORT_GUARDED_BY(mu_) = 0;
  bool stop_ COHORT_GUARDED_BY(mu_) = false;
};

}  // namespace

MetricsServer::MetricsServer(ServerOptions options) : o_(std::move(options)) {
  if (!o_.registry) o_.registry = &DefaultRegistry();
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(ServerOptions options) {
  std::unique_ptr<MetricsServer> s(new MetricsServer(std::move(options)));
  s->server_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second agent
  // bind the same port silently instead of reporting it in use.
  s->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Slow or silent clients must not lock the dashboard out: requests are short, so a client
  // gets 2 s per read and per idle keep-alive, and a thread is added for every connection
  // that would otherwise wait (GrowingPool; httplib's default is 8 fixed threads, which 8
  // clients that send a request line and stop could hold).
  s->server_->set_read_timeout(2, 0);
  s->server_->set_keep_alive_timeout(2);
  s->server_->new_task_queue = [] { return new GrowingPool(); };
  MetricsServer* self = s.get();
  s->server_->Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(self->MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s->server_->Get("/api/state", [self](const httplib::Request& req, httplib::Response& res) {
    uint64_t since = 0;
    if (req.has_param("since")) {
      since = static_cast<uint64_t>(ParseInt64(req.get_param_value("since")).value_or(0));
    }
    res.set_header("Cache-Control", "no-store");
    res.set_content(self->State(since).dump(), "application/json");
  });
  s->server_->Get("/api/history", [self](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(self->History().dump(), "application/json");
  });
  s->server_->Get("/api/job", [self](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    if (!self->o_.job) {
      res.status = 404;
      res.set_content(R"({"error":"this endpoint has no job view"})", "application/json");
      return;
    }
    int rank = -1;
    if (req.has_param("rank")) {
      rank = static_cast<int>(ParseInt64(req.get_param_value("rank")).value_or(-1));
    }
    res.set_content(self->o_.job(rank).dump(), "application/json");
  });
  s->server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kDashboardPage, "text/html; charset=utf-8");
  });
  s->server_->Get("/job", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kJobPage, "text/html; charset=utf-8");
  });
  const std::string& host = s->o_.host;
  if (s->o_.port == 0) {
    s->port_ = s->server_->bind_to_any_port(host.c_str());
  } else if (s->server_->bind_to_port(host.c_str(), s->o_.port)) {
    s->port_ = s->o_.port;
  } else {
    s->port_ = -1;
  }
  if (s->port_ <= 0) {
    return AlreadyExists("cannot listen on {}:{} for metrics (the port is in use or not "
                         "allowed): pick another --metrics-port, or 0 for any free port",
                         host, s->o_.port);
  }
  s->thread_ = std::thread([self] {
    pthread_setname_np(pthread_self(), "metrics-http");
    self->server_->listen_after_bind();
  });
  // httplib's stop() is lost if it comes before the listen loop has started, and Stop()
  // would then wait forever: return only once the server runs (bounded).
  const Deadline ready = Deadline::AfterMs(10000);
  while (!s->server_->is_running() && !ready.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // startup handshake
  }
  if (!s->server_->is_running()) {
    return Internal("the metrics server on {}:{} did not start", host, s->port_);
  }
  return s;
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string MetricsServer::MetricsText() {
  std::vector<WorkerProcess> workers = o_.workers ? o_.workers() : std::vector<WorkerProcess>{};
  {
    MutexLock lock(&mu_);
    last_system_ = sampler_.Sample(workers, *o_.registry);
  }
  std::vector<Source> sources = {{o_.registry->ToJson(), {}}};
  if (!o_.metrics_dir.empty()) {
    for (auto& snap : ReadRankSnapshots(o_.metrics_dir)) {
      sources.push_back({std::move(snap.metrics), {{"rank", std::to_string(snap.rank)}}});
    }
  }
  return RenderPrometheus(sources);
}

namespace {

// {"name{labels}": value} of a snapshot's scalar metrics, for the dashboard.
nlohmann::json Flatten(const nlohmann::json& metrics) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& m : metrics) {
    std::string key = m.value("name", "");
    if (m.contains("labels") && !m["labels"].empty()) {
      std::string labels;
      for (const auto& [k, v] : m["labels"].items()) {
        labels += (labels.empty() ? "" : ",") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
      }
      key += "{" + labels + "}";
    }
    if (m.contains("value")) {
      out[key] = m["value"];
    } else if (m.contains("count")) {
      out[key + ":count"] = m["count"];
      out[key + ":sum"] = m["sum"];
    }
  }
  return out;
}

}  // namespace

nlohmann::json MetricsServer::History() {
  nlohmann::json ranks = nlohmann::json::array();
  if (o_.metrics_dir.empty()) return {{"ranks", ranks}};
  auto value = [](const nlohmann::json& metrics, const char* name) -> nlohmann::json {
    const std::optional<double> v = MetricValue(metrics, name);
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  for (const auto& points : ReadRankHistories(o_.metrics_dir, 512 << 10)) {
    nlohmann::json series = nlohmann::json::array();
    for (const auto& p : points) {
      series.push_back({p.time, value(p.metrics, "cohort_train_samples_per_second"),
                        value(p.metrics, "cohort_train_loss"),
                        value(p.metrics, "cohort_train_step")});
    }
    ranks.push_back({{"rank", points[0].rank}, {"points", series}});
  }
  return {{"ranks", ranks}, {"columns", {"time", "samples_per_s", "loss", "step"}}};
}

nlohmann::json MetricsServer::State(uint64_t since) {
  std::vector<WorkerProcess> workers = o_.workers ? o_.workers() : std::vector<WorkerProcess>{};
  nlohmann::json system;
  {
    MutexLock lock(&mu_);
    last_system_ = sampler_.Sample(workers, *o_.registry);
    system = last_system_;
  }
  nlohmann::json ranks = nlohmann::json::array();
  if (!o_.metrics_dir.empty()) {
    for (const auto& snap : ReadRankSnapshots(o_.metrics_dir)) {
      ranks.push_back({{"rank", snap.rank}, {"time", snap.time}, {"metrics", Flatten(snap.metrics)}});
    }
  }
  return {{"agent", o_.state ? o_.state() : nlohmann::json::object()},
          {"agent_metrics", Flatten(o_.registry->ToJson())},
          {"ranks", ranks},
          {"system", system},
          {"events", o_.events ? o_.events->Since(since) : nlohmann::json::array()}};
}

}  // namespace cohort::metrics
