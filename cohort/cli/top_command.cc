// `cohort top ENDPOINT` | `cohort top --rdzv-endpoint HOST:PORT --rdzv-id ID [--rdzv-backend
// c10d|etcd]`: the whole job in a terminal, redrawn every --interval seconds (or once with
// --once): the job's totals, one line per node (state, round, restarts, CPU, and why a node
// that left is gone), one line per rank (state, step, loss, samples/s, communication wait
// and volume, CPU, RSS), the latest restarts with their causes and the last log lines (of
// every rank, or of --rank R).
//
// ENDPOINT is any agent's metrics endpoint (`cohort run --metrics-port`): its /api/job is
// the job-wide view (metrics/job_view.h). With the job's store instead, `cohort top` reads
// the job's directory of endpoints itself (agent/job_directory.h) and asks every agent.
//
// Thread-safety: main thread only (JobView asks the agents from its own short-lived threads).
#include "cohort/cli/top_command.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cohort/agent/job_directory.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/job_store.h"
#include "cohort/metrics/job_view.h"
#include "cohort/metrics/json_read.h"
#include "cohort/store/job_store_access.h"

namespace cohort::cli {
namespace {

using json = nlohmann::json;
using namespace metrics::json_read;  // NOLINT: the readers of foreign JSON

std::string Num(const json& v, int digits, double scale = 1) {
  if (!v.is_number()) return "-";
  return fmt::format("{:.{}f}", v.get<double>() * scale, digits);
}

std::string Clock(double t) { return FormatTime(t, "%H:%M:%S"); }

std::string Cut(std::string s, size_t width) {
  if (s.size() > width) s = s.substr(0, width > 3 ? width - 3 : 0) + "...";
  return s;
}

std::string NodeName(const json& n) {
  const std::string addr = Str(n, "addr"), host = Str(n, "host");
  return addr.empty() || addr == host ? host : host + " " + addr;
}

// One frame of the view, for a terminal `width` columns wide.
std::string Render(const json& job, const std::string& source, size_t width, int log_lines) {
  const json& s = At(job, "summary");
  std::string out = fmt::format(
      "cohort top  job {}  {}  from {}\n"
      "nodes {} (running {}, lost {}, unreachable {}, finished {}, failed {})  ranks {}  "
      "world size {}  samples/s {}\n",
      Str(job, "run_id", "?"), Clock(Dbl(job, "time")), source, Int(s, "nodes"),
      Int(s, "running"), Int(s, "lost"), Int(s, "unreachable"), Int(s, "finished"),
      Int(s, "failed"), Int(s, "ranks"), Int(s, "world_size"), Num(At(s, "samples_per_s"), 0));
  if (!Str(job, "directory_error").empty()) {
    out += "the job's store did not answer: " + Str(job, "directory_error") + "\n";
  }
  if (Arr(job, "nodes").empty()) {
    out += "no agent of this job has published its endpoint (yet): agents publish theirs when "
           "started with --metrics-port\n";
  }
  out += fmt::format("\n{:>4}  {:<28} {:<11} {:>5} {:>5} {:>8} {:>7} {:>5}  {}\n", "NODE",
                     "HOST", "STATE", "ROUND", "RANK", "RESTARTS", "REFORMS", "CPU%",
                     "CAUSE / GPUS");
  for (const auto& n : Arr(job, "nodes")) {
    std::string tail = Str(n, "cause");
    if (tail.empty()) tail = Str(n, "gpus");
    std::string line = fmt::format("{:>4}  {:<28} {:<11} {:>5} {:>5} {:>8} {:>7} {:>5}  {}",
                                   Int(n, "index"), Cut(NodeName(n), 28), Str(n, "state", "?"),
                                   Num(At(n, "round"), 0), Num(At(n, "group_rank"), 0),
                                   Num(At(n, "restarts"), 0), Num(At(n, "reforms"), 0),
                                   Num(At(n, "cpu_percent"), 0), tail);
    out += Cut(line, width) + "\n";
  }
  out += fmt::format("\n{:>5}  {:<22} {:<11} {:>8} {:>9} {:>10} {:>9} {:>9} {:>5} {:>8}\n",
                     "RANK", "NODE", "STATE", "STEP", "LOSS", "SAMPLES/S", "COMM WAIT",
                     "COMM MB", "CPU%", "RSS MiB");
  for (const auto& n : Arr(job, "nodes")) {
    for (const auto& r : Arr(n, "ranks")) {
      const json& wait = At(r, "comm_wait");
      out += Cut(fmt::format("{:>5}  {:<22} {:<11} {:>8} {:>9} {:>10} {:>9} {:>9} {:>5} {:>8}",
                             Int(r, "rank", -1), Cut(NodeName(n), 22),
                             Cut(Str(r, "state", "-"), 11), Num(At(r, "step"), 0),
                             Num(At(r, "loss"), 4), Num(At(r, "samples_per_s"), 0),
                             wait.is_number() ? Num(wait, 1, 100) + "%" : "-",
                             Num(At(r, "comm_bytes"), 1, 1e-6), Num(At(r, "cpu_percent"), 0),
                             Num(At(r, "rss_bytes"), 0, 1.0 / 1048576)),
                 width) + "\n";
    }
  }
  std::vector<std::pair<double, std::string>> events;
  for (const auto& n : Arr(job, "nodes")) {
    for (const auto& e : Arr(n, "events")) {
      if (Str(e, "cause") == "start") continue;
      const std::string cause = Str(e, "cause");
      events.emplace_back(Dbl(e, "time"),
                          fmt::format("{} {} {} (round {}){}{}", Clock(Dbl(e, "time")),
                                      NodeName(n), Str(e, "type"), Int(e, "round", -1),
                                      cause.empty() ? "" : ": ", cause));
    }
  }
  std::sort(events.begin(), events.end());
  if (!events.empty()) {
    out += "\nRESTARTS AND FAILURES\n";
    for (size_t i = events.size() > 6 ? events.size() - 6 : 0; i < events.size(); ++i) {
      out += Cut(events[i].second, width) + "\n";
    }
  }
  const json& logs = Arr(job, "logs");
  if (log_lines > 0 && !logs.empty()) {
    out += "\nLOGS\n";
    const size_t from = logs.size() > size_t(log_lines) ? logs.size() - log_lines : 0;
    for (size_t i = from; i < logs.size(); ++i) {
      const json& l = logs[i];
      out += Cut(fmt::format("[{} rank{}] {}", Str(l, "addr", Str(l, "host")), Int(l, "rank", -1),
                             Str(l, "line")),
                 width) + "\n";
    }
  }
  return out;
}

size_t TerminalWidth() {
  if (const std::optional<std::string> c = SystemEnv("COLUMNS")) {
    if (auto n = ParseInt64(*c); n && *n > 20) return static_cast<size_t>(*n);
  }
  return 160;
}

// Connections to the job's store named by cohort run's flags: etcd (keys of `rdzv_id`; TLS
// and user from --rdzv-conf as for cohort run, the password from COHORT_ETCD_PASSWORD), or
// a cohort store with the job's token from COHORT_TOKEN.
Result<agent::StoreConnector> JobStoreConnector(const std::string& backend,
                                                const std::string& endpoint,
                                                const std::string& rdzv_id,
                                                const std::string& rdzv_conf) {
  if (backend == "etcd" || backend == "etcd-v2") {
    store::EtcdStoreOptions eo;
    std::string rest;
    bool https = false;
    COHORT_RETURN_IF_ERROR(SplitEtcdConf(rdzv_conf, eo, &rest, &https));
    COHORT_ASSIGN_OR_RETURN(auto endpoints,
                            store::ParseEtcdEndpoints(endpoint, https || !eo.ca_file.empty()));
    eo.endpoints = endpoints;
    eo.prefix = rdzv_id;
    return store::ConnectorFor(store::EtcdAccess(eo));
  }
  auto hp = ParseHostPort(endpoint, 29400);
  if (!hp) return InvalidArgument("--rdzv-endpoint '{}' is not HOST:PORT", endpoint);
  const std::string token = worker_env::Inherited(worker_env::kToken).value_or("");
  if (token.empty()) {
    return InvalidArgument("a cohort store needs the job's token: set COHORT_TOKEN as for "
                           "cohort run");
  }
  return store::ConnectorFor(store::TcpAccess({.host = hp->first, .port = hp->second, .token = token}));
}

}  // namespace

int TopCommand(const std::vector<std::string>& args) {
  CLI::App app("The whole job in a terminal: every node and rank, restarts, recent logs.",
               "cohort top");
  std::string endpoint, rdzv_endpoint, rdzv_id = "none", backend = "c10d";
  double interval = 2;
  bool once = false;
  int log_lines = 8;
  app.add_option("endpoint", endpoint,
                 "any agent's metrics endpoint (cohort run --metrics-port): http://host:port/ "
                 "or host:port");
  app.add_option("--rdzv-endpoint", rdzv_endpoint,
                 "instead of an endpoint: the job's store (the --rdzv-endpoint of cohort run; "
                 "COHORT_TOKEN for a cohort store)");
  app.add_option("--rdzv-id", rdzv_id, "the job's --rdzv-id (with --rdzv-endpoint)");
  std::string rdzv_conf;
  app.add_option("--rdzv-conf", rdzv_conf,
                 "etcd client settings as for cohort run: protocol, cacert, cert, key, user");
  app.add_option("--rdzv-backend", backend, "c10d (a cohort store) or etcd")
      ->check(CLI::IsMember({"c10d", "static", "etcd", "etcd-v2"}));
  app.add_option("--interval", interval, "seconds between refreshes")
      ->check(CLI::Range(0.2, 3600.0));
  app.add_flag("--once", once, "print one view and exit (for scripts)");
  app.add_option("--logs", log_lines, "log lines to show")->check(CLI::Range(0, 1000));
  int log_rank = -1;
  app.add_option("--rank", log_rank, "show the log lines of this rank only")
      ->check(CLI::NonNegativeNumber);
  if (int rc = ParseCommandLine(app, args, "top", kExitInvalidValue); rc >= 0) return rc;
  if (endpoint.empty() == rdzv_endpoint.empty()) {
    fmt::print(stderr, "cohort top: give one agent's metrics endpoint (cohort top "
                       "http://host:port/) or the job's store (--rdzv-endpoint HOST:PORT "
                       "--rdzv-id ID); see cohort top --help\n");
    return kExitUsage;
  }

  // Where the view comes from: an agent's /api/job, or a JobView of our own over the store.
  std::function<Result<json>()> fetch;
  std::string source;
  std::unique_ptr<metrics::JobView> view;
  if (!endpoint.empty()) {
    std::string url = endpoint.find("://") == std::string::npos ? "http://" + endpoint : endpoint;
    if (url.back() != '/') url += '/';
    source = url;
    const std::string query = log_rank >= 0 ? fmt::format("api/job?rank={}", log_rank) : "api/job";
    fetch = [url, query] { return metrics::FetchJson(url + query, std::chrono::seconds(10)); };
  } else {
    auto connector = JobStoreConnector(backend, rdzv_endpoint, rdzv_id, rdzv_conf);
    if (!connector.ok()) return CommandFailed("top", connector.status(), kExitInvalidValue);
    // A store that does not answer at the start is an error; later it is re-connected.
    auto store = (*connector)(Deadline::AfterMs(5000));
    if (!store.ok()) return CommandFailed("top", store.status(), kExitRendezvous);
    source = rdzv_endpoint;
    view = std::make_unique<metrics::JobView>(metrics::JobViewOptions{
        .list = agent::DirectoryReader(*connector, rdzv_id, std::chrono::seconds(5), *store)});
    fetch = [v = view.get(), log_rank]() -> Result<json> { return v->Snapshot(log_rank); };
  }

  // The launcher blocks the agent's signals at start: here Ctrl-C simply ends the view.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
  const bool tty = ::isatty(STDOUT_FILENO);
  for (bool first = true;; first = false) {
    auto job = fetch();
    if (!job.ok() && first) {
      return CommandFailed("top",
                           Unavailable("{} (is the job running, with --metrics-port on its "
                                       "agents?)",
                                       job.status().message()),
                           kExitRendezvous);
    }
    // Every text in the frame came from agents (log lines, causes, host names): control
    // characters are dropped, so none can move the cursor, set the title or the clipboard.
    std::string frame = StripControl(
        job.ok() ? Render(*job, source, TerminalWidth(), log_lines)
                 : fmt::format("cohort top: {} (retrying)\n", job.status().message()));
    if (tty && !once) frame = "\x1b[H\x1b[2J" + frame;
    fmt::print("{}", frame);
    std::fflush(stdout);
    if (once) {
      if (!job.ok()) return kExitRendezvous;
      if (!Str(*job, "directory_error").empty() || Arr(*job, "nodes").empty()) {
        fmt::print(stderr, "cohort top: {}\n",
                   StripControl(Str(*job, "directory_error").empty()
                       ? "no agent of this job has published its metrics endpoint: is the job "
                         "running with --metrics-port, and is --rdzv-id right?"
                       : "the job's store did not answer: " + Str(*job, "directory_error")));
        return kExitRendezvous;
      }
      return kExitOk;
    }
    // The refresh period; Ctrl-C (the default SIGINT action) ends it.
    ::poll(nullptr, 0, static_cast<int>(interval * 1000));
  }
}

}  // namespace cohort::cli
