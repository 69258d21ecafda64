// Implements `cohort run`. Thread-safety: single-threaded until the agent starts; the
// embedded StoreServer runs on its own thread.
#include "cohort/cli/run_command.h"

#include <arpa/inet.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cohort/agent/agent.h"
#include "cohort/agent/job_directory.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/base/log.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/worker_env.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/exec_sibling.h"
#include "cohort/cli/job_store.h"
#include "cohort/cli/run_store.h"
#include "cohort/metrics/http_server.h"
#include "cohort/metrics/job_view.h"
#include "cohort/net/socket.h"
#include "cohort/store/etcd_store.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tcp_store.h"

namespace cohort::cli {
namespace {

namespace fs = std::filesystem;


// Values of every flag, as strings where torchrun accepts several forms.
struct RunFlags {
  std::string nproc_per_node = "1";
  std::string nnodes = "1";
  int node_rank = 0;
  std::string rdzv_backend = "store";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval = 0.1;
  std::string start_method = "spawn";
  std::string role = "default";
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  std::vector<std::string> preload;  // modules the warm interpreter imports first
  bool no_preload = false;           // every worker starts a fresh interpreter
  bool standby = false;              // a warm spare: admitted only in place of a lost node
  std::string master_addr;
  int master_port = 0;
  std::string local_addr;
  double stop_grace = 5.0;
  int metrics_port = -1;            // -1: no metrics endpoint
  std::string metrics_host = "127.0.0.1";
  int log_merge_ms = 100;
};

// A user error: message plus exit code.
struct UsageError {
  int code;
  std::string message;
};

void AddFlags(CLI::App& app, RunFlags& f) {
  auto opt = [&](const char* names, auto& value, const char* env, const char* help) {
    return app.add_option(names, value, help)->envname(env);
  };
  opt("--nproc-per-node,--nproc_per_node", f.nproc_per_node, "PET_NPROC_PER_NODE",
      "workers per node: a number, or cpu/auto (one per CPU core)");
  opt("--nnodes", f.nnodes, "PET_NNODES", "number of nodes, N or MIN:MAX (elastic)");
  opt("--node-rank,--node_rank", f.node_rank, "PET_NODE_RANK", "rank of this node (informational)");
  opt("--rdzv-backend,--rdzv_backend", f.rdzv_backend, "PET_RDZV_BACKEND",
      "rendezvous backend: store (embedded, default; c10d is an alias) or etcd (v3 API; "
      "etcd-v2 is an alias)");
  opt("--rdzv-endpoint,--rdzv_endpoint", f.rdzv_endpoint, "PET_RDZV_ENDPOINT",
      "host:port of the rendezvous store; the node on that host serves it, listening only "
      "on that address (0.0.0.0:port: every interface; etcd: h1:2379,h2:2379,...)");
  opt("--rdzv-id,--rdzv_id", f.rdzv_id, "PET_RDZV_ID", "job id shared by all nodes");
  opt("--rdzv-conf,--rdzv_conf", f.rdzv_conf, "PET_RDZV_CONF",
      "key=value,... : join_timeout, last_call_timeout, close_timeout, keep_alive_interval, "
      "keep_alive_max_attempt, layout_grace, is_host, carry_start_nodes, quiet_start_nodes, "
      "quiet_watch_max_nodes, tell_start_nodes");
  app.add_flag("--standalone", f.standalone, "single node with its own embedded store")
      ->envname("PET_STANDALONE");
  opt("--max-restarts,--max_restarts", f.max_restarts, "PET_MAX_RESTARTS",
      "job-wide number of worker-group restarts before the job fails");
  opt("--monitor-interval,--monitor_interval", f.monitor_interval, "PET_MONITOR_INTERVAL",
      "accepted for torchrun compatibility; cohort notices exits at once");
  opt("--start-method,--start_method", f.start_method, "PET_START_METHOD",
      "accepted for torchrun compatibility (workers are always exec'd)");
  opt("--role", f.role, "PET_ROLE", "worker role name");
  opt("--log-dir,--log_dir", f.log_dir, "PET_LOG_DIR",
      "directory for per-attempt, per-rank logs (default: $TMPDIR/cohort-logs-<uid>, "
      "private to this user)");
  opt("-r,--redirects", f.redirects, "PET_REDIRECTS",
      "streams sent to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or 0:1,1:2");
  opt("-t,--tee", f.tee, "PET_TEE", "streams sent to console and files (same syntax)");
  opt("--local-ranks-filter,--local_ranks_filter", f.local_ranks_filter,
      "PET_LOCAL_RANKS_FILTER", "show only these local ranks on the console, e.g. 0,1");
  app.add_flag("-m,--module", f.module, "run the entrypoint as a python module")
      ->envname("PET_MODULE");
  app.add_flag("--no-python,--no_python", f.no_python, "exec the entrypoint directly")
      ->envname("PET_NO_PYTHON");
  app.add_flag("--run-path,--run_path", f.run_path, "accepted for torchrun compatibility")
      ->envname("PET_RUN_PATH");
  app.add_option("--preload", f.preload,
                 "python entrypoints: modules the node's warm interpreter imports before it "
                 "forks the workers (default: torch when the script mentions it); repeat or "
                 "separate with commas")
      ->delimiter(',');
  app.add_flag("--no-preload", f.no_preload,
               "python entrypoints: start every worker in a fresh interpreter");
  app.add_flag("--standby", f.standby,
               "a warm spare: import what the workers need, then wait, without joining, "
               "until a node of the running job is lost and take its place");
  opt("--master-addr,--master_addr", f.master_addr, "PET_MASTER_ADDR",
      "MASTER_ADDR given to workers (default: the first node's address)");
  opt("--master-port,--master_port", f.master_port, "PET_MASTER_PORT",
      "MASTER_PORT given to workers (default: a free port reserved for this job)");
  opt("--local-addr,--local_addr", f.local_addr, "PET_LOCAL_ADDR",
      "address other nodes reach this node at");
  opt("--stop-grace", f.stop_grace, "COHORT_STOP_GRACE",
      "seconds between the stop signal and SIGKILL when stopping workers");
  opt("--metrics-port", f.metrics_port, "COHORT_METRICS_PORT",
      "serve Prometheus /metrics and the live dashboard on this port (0: any free port)");
  opt("--metrics-host", f.metrics_host, "COHORT_METRICS_HOST",
      "address the metrics endpoint listens on (default 127.0.0.1: it shows log lines, PIDs "
      "and host names without authentication; 0.0.0.0 to serve every interface)");
  opt("--log-merge-ms", f.log_merge_ms, "COHORT_LOG_MERGE_MS",
      "print identical console lines of several ranks within this window once, as "
      "[ranks 0-3]: ... (0: off)");
}

// Splits "cohort run [options] program [args]" into the options part and the program part,
// so that the program's own flags are never parsed as ours.
Result<std::pair<std::vector<std::string>, std::vector<std::string>>> SplitArgs(
    const CLI::App& app, const std::vector<std::string>& args) {
  std::map<std::string, bool> takes_value;  // "--name" or "-n" -> expects a value
  for (const CLI::Option* o : app.get_options()) {
    bool value = o->get_expected_max() > 0;  // flags expect no value
    for (const auto& l : o->get_lnames()) takes_value["--" + l] = value;
    for (const auto& s : o->get_snames()) takes_value["-" + s] = value;
  }
  std::vector<std::string> ours, program;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      program.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      program.assign(args.begin() + static_cast<long>(i), args.end());
      break;
    }
    std::string name = a.substr(0, a.find('='));
    auto it = takes_value.find(name);
    if (it == takes_value.end()) {
      return InvalidArgument("unknown option '{}'", name);
    }
    ours.push_back(a);
    if (it->second && a.find('=') == std::string::npos && i + 1 < args.size()) {
      ours.push_back(args[++i]);
    }
  }
  return std::make_pair(ours, program);
}

Result<std::pair<int, int>> ParseNnodes(const std::string& text) {
  auto parts = Split(text, ':', false);
  auto bad = [&] {
    return InvalidArgument("--nnodes '{}' is not N or MIN:MAX with positive integers", text);
  };
  if (parts.empty() || parts.size() > 2) return bad();
  auto lo = ParseInt64(parts[0]);
  auto hi = parts.size() == 2 ? ParseInt64(parts[1]) : lo;
  if (!lo || !hi || *lo < 1 || *hi < 1) return bad();
  if (*lo > *hi) {
    return InvalidArgument("--nnodes {}: the minimum ({}) exceeds the maximum ({}); write MIN:MAX",
                           text, *lo, *hi);
  }
  return std::make_pair(static_cast<int>(*lo), static_cast<int>(*hi));
}

Result<int> ParseNproc(const std::string& text) {
  if (text == "cpu" || text == "auto") {
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  if (text == "gpu") {
    int gpus = 0;
    while (fs::exists(fmt::format("/dev/nvidia{}", gpus))) ++gpus;
    if (gpus == 0) return InvalidArgument("--nproc-per-node gpu: this machine has no GPU");
    return gpus;
  }
  auto n = ParseInt64(text);
  if (!n || *n < 1 || *n > 4096) {
    return InvalidArgument("--nproc-per-node '{}' must be a number from 1 to 4096, or cpu/auto",
                           text);
  }
  return static_cast<int>(*n);
}

Result<agent::StreamPolicy> ParseStreams(const std::string& flag, const std::string& text) {
  agent::StreamPolicy p;
  auto bad = [&] {
    return InvalidArgument("{} '{}' must be 0-3 or a list like 0:1,1:2", flag, text);
  };
  if (text.find(':') == std::string::npos) {
    auto v = ParseInt64(text);
    if (!v || *v < 0 || *v > 3) return bad();
    p.all = static_cast<int>(*v);
    return p;
  }
  for (const auto& item : Split(text, ',')) {
    auto kv = Split(item, ':');
    if (kv.size() != 2) return bad();
    auto rank = ParseInt64(kv[0]), v = ParseInt64(kv[1]);
    if (!rank || !v || *rank < 0 || *v < 0 || *v > 3) return bad();
    p.per_local_rank[static_cast<int>(*rank)] = static_cast<int>(*v);
  }
  return p;
}

// The --rdzv-conf keys that are node counts: their least value and what it means.
struct NodeCountKey {
  std::string_view key;
  int min;
  std::string_view min_means;
  int rendezvous::RendezvousConfig::*field;
};
constexpr NodeCountKey kNodeCountKeys[] = {
    {"carry_start_nodes", 0, "never carry", &rendezvous::RendezvousConfig::carry_start_nodes},
    {"quiet_start_nodes", 1, "every round", &rendezvous::RendezvousConfig::quiet_start_nodes},
    {"quiet_watch_max_nodes", 0, "no held watches",
     &rendezvous::RendezvousConfig::quiet_watch_max_nodes},
    {"tell_start_nodes", 0, "never tell", &rendezvous::RendezvousConfig::tell_start_nodes},
};

const NodeCountKey* FindNodeCountKey(std::string_view key) {
  for (const auto& k : kNodeCountKeys) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

Status ApplyRdzvConf(const std::string& text, rendezvous::RendezvousConfig& c,
                     std::optional<bool>& is_host) {
  int64_t keep_alive_attempts = 10;
  for (const auto& item : Split(text, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--rdzv-conf item '{}' is not key=value", item);
    }
    std::string key = std::string(Trim(item.substr(0, eq)));
    std::string value = std::string(Trim(item.substr(eq + 1)));
    auto seconds = ParseDouble(value);
    // A finite number of seconds within [lo, hi]: nan, inf and 1e300 would overflow the
    // clock (a deadline already past), 0 beats would spin.
    auto dur = [&](Duration& out, double lo, double hi) -> Status {
      if (!seconds || !std::isfinite(*seconds) || *seconds < lo || *seconds > hi) {
        return InvalidArgument("--rdzv-conf {}={} must be a number of seconds from {:g} to {:g}",
                               key, value, lo, hi);
      }
      out = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(*seconds));
      return Status::Ok();
    };
    constexpr double kWeek = 7 * 24 * 3600;
    if (key == "join_timeout" || key == "timeout") {
      COHORT_RETURN_IF_ERROR(dur(c.join_timeout, 0.001, kWeek));
    } else if (key == "last_call_timeout") {
      COHORT_RETURN_IF_ERROR(dur(c.last_call, 0, 3600));
    } else if (key == "layout_grace") {
      COHORT_RETURN_IF_ERROR(dur(c.layout_grace, 1, 3600));
    } else if (key == "keep_alive_interval") {
      COHORT_RETURN_IF_ERROR(dur(c.heartbeat_interval, 0.01, 3600));
    } else if (key == "keep_alive_max_attempt") {
      auto n = ParseInt64(value);
      if (!n || *n < 1 || *n > 1000) {
        return InvalidArgument("--rdzv-conf keep_alive_max_attempt={} must be a count from 1 "
                               "to 1000", value);
      }
      keep_alive_attempts = *n;
    } else if (const NodeCountKey* count = FindNodeCountKey(key)) {
      auto n = ParseInt64(value);
      if (!n || *n < count->min || *n > 1000000) {
        return InvalidArgument("--rdzv-conf {}={} must be a node count from {} ({}) to 1000000",
                               key, value, count->min, count->min_means);
      }
      c.*(count->field) = static_cast<int>(*n);
    } else if (key == "is_host") {
      auto b = ParseBool(value);
      if (!b) return InvalidArgument("--rdzv-conf is_host={} is not a boolean", value);
      is_host = *b;
    } else if (key == "close_timeout" || key == "read_timeout") {
      Duration ignored;
      COHORT_RETURN_IF_ERROR(dur(ignored, 0, kWeek));
    } else {
      return InvalidArgument(
          "--rdzv-conf: unknown key '{}' (known: join_timeout, last_call_timeout, "
          "close_timeout, read_timeout, keep_alive_interval, keep_alive_max_attempt, "
          "layout_grace, is_host, carry_start_nodes, quiet_start_nodes, "
          "quiet_watch_max_nodes, tell_start_nodes)",
          key);
    }
  }
  c.dead_timeout = c.heartbeat_interval * keep_alive_attempts;
  return Status::Ok();
}

// The worker command line, resolved the way torchrun does for .py files and -m. torchrun
// runs them with its own interpreter; cohort has none, so it takes COHORT_PYTHON, else the
// `python3` on PATH, and says which one in `note` (shown with a failed job's summary: a
// python3 without torch fails with a bare ModuleNotFoundError otherwise). `program_at` is
// where the script (or module) stands in the result, 0 when cohort runs no interpreter.
Result<std::vector<std::string>> WorkerArgv(const RunFlags& f,
                                            const std::vector<std::string>& program,
                                            std::string* note, size_t* program_at) {
  const std::string& entry = program[0];
  std::vector<std::string> rest(program.begin() + 1, program.end());
  const bool chosen = SystemEnv(settings::kPython.name()).has_value();
  const std::string python = settings::kPython.Get();
  std::vector<std::string> argv;
  if (f.module) {
    if (f.no_python) return InvalidArgument("-m and --no-python cannot be combined");
    argv = {python, "-u", "-m", entry};
  } else if (!f.no_python && EndsWith(entry, ".py")) {
    if (!fs::is_regular_file(entry)) {
      return NotFound("the script '{}' does not exist", entry);
    }
    argv = {python, "-u", entry};
  } else {
    argv = {entry};
  }
  *program_at = argv.size() > 1 ? argv.size() - 1 : 0;
  auto found = FindProgram(argv[0]);
  if (!found.ok()) {
    return Status(found.status().code(),
                  fmt::format("cannot run the entrypoint: {}{}", found.status().message(),
                              argv[0] == python ? " (set COHORT_PYTHON to the interpreter "
                                                  "that has your packages)"
                                                : ""));
  }
  if (argv[0] == python) {
    std::error_code ec;
    fs::path real = fs::canonical(*found, ec);
    *note = fmt::format("the workers ran {}{} ({}); set COHORT_PYTHON to the interpreter that "
                        "has your packages (e.g. COHORT_PYTHON=/usr/bin/python3)",
                        *found, ec || real == fs::path(*found) ? "" : " -> " + real.string(),
                        chosen ? "COHORT_PYTHON" : "python3 on PATH");
  }
  argv.insert(argv.end(), rest.begin(), rest.end());
  return argv;
}

// For python workers: the directory of cohort's Python packages (cohort_torch) on their
// PYTHONPATH, and the warm interpreter that forks them (unless --no-preload).
void AddPythonSupport(const RunFlags& f, const std::vector<std::string>& argv,
                      size_t program_at, agent::WorkerSpec& spec) {
  const std::string zygote = SiblingPath("python/cohort_zygote.py");
  const std::string dir = fs::path(zygote).parent_path().string();
  // The build tree keeps cohort_torch beside the zygote; installed, it is in Python's own
  // dist-packages and nothing is added.
  if (fs::is_directory(dir + "/cohort_torch")) {
    const std::optional<std::string> old = SystemEnv("PYTHONPATH");
    spec.extra_env.emplace_back("PYTHONPATH", old ? fmt::format("{}:{}", dir, *old) : dir);
  }
  if (program_at == 0 || f.no_preload || !fs::is_regular_file(zygote)) return;
  auto& warm = spec.warm;
  warm.program_at = program_at;
  warm.module = f.module;
  warm.zygote_script = zygote;
  for (const auto& m : f.preload) {
    if (!m.empty()) warm.preload.push_back(m);
  }
  if (f.preload.empty() && !f.module) {
    std::ifstream in(argv[program_at]);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("torch") != std::string::npos) warm.preload.push_back("torch");
  }
}

// The values of the flags that need no other flag to be checked; -1 when all can work,
// else the exit code (the reason printed).
struct CheckedValues {
  decltype(agent::WorkerSpec::redirects) redirects;
  decltype(agent::WorkerSpec::tee) tee;
  std::set<int> local_ranks_filter;
};

int CheckValues(const RunFlags& f, int nproc, CheckedValues* out) {
  // Descriptors for every worker, and a socket per store client: raise the soft limit to
  // the hard one, and refuse now (not after minutes of starting workers) when even that
  // is too low.
  store::RaiseFileLimit();
  if (rlimit files{}; ::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    const uint64_t needed = uint64_t(nproc) * agent::kDescriptorsPerWorker + 256;
    if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < needed) {
      return RunFailed(kExitInvalidValue,
                  fmt::format("--nproc-per-node {} needs about {} open files, but this process "
                              "may open {} (ulimit -n, hard limit); raise the limit or start "
                              "fewer workers per node",
                              nproc, needed, files.rlim_cur));
    }
  }
  auto redirects = ParseStreams("--redirects", f.redirects);
  if (!redirects.ok()) return RunFailed(kExitInvalidValue, redirects.status().message());
  out->redirects = *redirects;
  auto tee = ParseStreams("--tee", f.tee);
  if (!tee.ok()) return RunFailed(kExitInvalidValue, tee.status().message());
  out->tee = *tee;
  if (f.max_restarts < 0) return RunFailed(kExitInvalidValue, "--max-restarts must be >= 0");
  if (!(f.stop_grace >= 0 && f.stop_grace <= 86400)) {  // also refuses nan
    return RunFailed(kExitInvalidValue, "--stop-grace must be a number of seconds from 0 to 86400");
  }
  // Accepted as torchrun does, unused (worker exits are seen at once), but still a number.
  if (!(f.monitor_interval > 0 && f.monitor_interval <= 3600)) {
    return RunFailed(kExitInvalidValue,
                "--monitor-interval must be a number of seconds above 0, at most 3600");
  }
  if (f.master_port < 0 || f.master_port > 65535) {
    return RunFailed(kExitInvalidValue, fmt::format("--master-port {} is not a port (0 to 65535; "
                                               "0: a free one)", f.master_port));
  }
  if (f.metrics_port < -1 || f.metrics_port > 65535) {
    return RunFailed(kExitInvalidValue, fmt::format("--metrics-port {} is not a port (0 to 65535; "
                                               "0: a free one)", f.metrics_port));
  }
  if (f.log_merge_ms < 0 || f.log_merge_ms > 60000) {
    return RunFailed(kExitInvalidValue, "--log-merge-ms must be from 0 (off) to 60000");
  }
  for (const auto& item : Split(f.local_ranks_filter, ',')) {
    auto r = ParseInt64(item);
    if (!r || *r < 0) {
      return RunFailed(kExitInvalidValue,
                  fmt::format("--local-ranks-filter '{}' must list local ranks like 0,1",
                              f.local_ranks_filter));
    }
    out->local_ranks_filter.insert(static_cast<int>(*r));
  }
  return -1;
}

using agent::StoreConnector;

// The agent's /metrics endpoint and dashboard (--metrics-port): wires `status` and `events`
// into the agent's options; nullptr (with a warning) when it cannot listen.
std::unique_ptr<metrics::MetricsServer> StartMetrics(const RunFlags& f, const std::string& run_id,
                                                     metrics::StatusBoard& status,
                                                     metrics::EventLog& events,
                                                     const StoreConnector& connect_within,
                                                     std::unique_ptr<metrics::JobView>* job_view,
                                                     agent::AgentOptions& o) {
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  // Per agent process: two agents of one job on one machine share the log directory.
  o.metrics_dir = fmt::format("{}/{}/metrics/agent{}", o.spec.log_dir, run_id, ::getpid());
  std::error_code ec;
  std::filesystem::remove_all(o.metrics_dir, ec);  // no stale ranks from an earlier run
  std::filesystem::create_directories(o.metrics_dir, ec);
  o.status = &status;
  o.events = &events;
  metrics::ServerOptions mo;
  mo.host = f.metrics_host;
  mo.port = f.metrics_port;
  mo.metrics_dir = o.metrics_dir;
  mo.events = &events;
  mo.state = [&status] { return status.Get(); };
  mo.workers = [&status] {
    std::vector<metrics::WorkerProcess> out;
    for (const auto& r : metrics::AgentStatus::FromJson(status.Get()).ranks) {
      if (r.healthy()) out.push_back({r.rank, r.local_rank, r.pid});
    }
    return out;
  };
  *job_view = std::make_unique<metrics::JobView>(metrics::JobViewOptions{
      .list = agent::DirectoryReader(connect_within, run_id)});
  mo.job = [view = job_view->get()](int rank) { return view->Snapshot(rank); };
  auto started = metrics::MetricsServer::Start(mo);
  if (started.ok()) {
    metrics_server = std::move(*started);
    std::string url_host = f.metrics_host == "0.0.0.0" ? o.self.addr : f.metrics_host;
    if (url_host.find(':') != std::string::npos) url_host = "[" + url_host + "]";  // IPv6
    o.metrics_url = fmt::format("http://{}:{}/", url_host, metrics_server->port());
    fmt::print(stderr, "cohort: metrics on {}metrics, dashboard on {}\n", o.metrics_url,
               o.metrics_url);
  } else {
    fmt::print(stderr, "cohort run: warning: {}; the job runs without the metrics endpoint\n",
               started.status().message());
  }
  return metrics_server;
}

// Everything `cohort run` resolved from its flags and environment before anything starts.
struct ResolvedRun {
  RunFlags f;
  std::vector<std::string> program;  // the entrypoint and its arguments, as given
  int nproc = 1;
  CheckedValues checked;
  bool use_etcd = false;
  store::EtcdStoreOptions etcd;
  rendezvous::RendezvousConfig rdzv;
  std::optional<bool> is_host;  // --rdzv-conf is_host
  std::vector<std::string> argv;  // the worker command line
  std::string entrypoint_note;
  size_t program_at = 0;
  bool single = true;  // one node at most
  StorePlan plan;
  bool own_run_id = false;  // the run id was made here: nobody else can use its keys
};

// Parses the command line; -1 to go on, else the exit code (--help, --print-config and
// --print-settings-markdown print and end here).
int ParseRunFlags(const std::vector<std::string>& args, ResolvedRun* r) {
  CLI::App app("Launch workers on this node (torchrun-compatible).", "cohort run");
  app.option_defaults()->always_capture_default();  // --print-config shows the defaults
  AddFlags(app, r->f);
  app.footer(
      "Usage: cohort run [options] ENTRYPOINT [ARGS...]\n"
      "A .py entrypoint runs with $COHORT_PYTHON (default python3) -u; -m runs a module;\n"
      "anything else is executed directly. Exit codes: docs/exit-codes.md.");
  bool print_config = false, markdown = false;
  app.add_flag("--print-config", print_config,
               "print every flag and COHORT_* setting in force and where it came from; exit");
  app.add_flag("--print-settings-markdown", markdown,
               "print the reference table of COHORT_* settings (docs/settings.md); exit");
  auto split = SplitArgs(app, args);
  if (!split.ok()) {
    return RunFailed(kExitUsage, split.status().message() + "; see 'cohort run --help'");
  }
  auto [ours, program] = std::move(split).value();
  if (int rc = ParseCommandLine(app, ours, "run", kExitInvalidValue); rc >= 0) return rc;
  if (markdown) {
    fmt::print("{}", SettingsTable(/*markdown=*/true));
    return kExitOk;
  }
  if (print_config) {
    fmt::print("{}", ConfigReport(app, ours));
    return kExitOk;
  }
  if (program.empty()) {
    return RunFailed(kExitUsage, "no entrypoint given: cohort run [options] ENTRYPOINT [ARGS...]");
  }
  r->program = std::move(program);
  return -1;
}

// Validates every value and decides the rendezvous, the store and the run id. -1 to go
// on, else the exit code (reason printed). Starts nothing.
int Resolve(ResolvedRun* r) {
  const RunFlags& f = r->f;
  const StoreFlags store_flags{f.standalone, f.rdzv_endpoint, f.rdzv_conf};
  auto nnodes = ParseNnodes(f.nnodes);
  if (!nnodes.ok()) return RunFailed(kExitInvalidValue, nnodes.status().message());
  auto nproc = ParseNproc(f.nproc_per_node);
  if (!nproc.ok()) return RunFailed(kExitInvalidValue, nproc.status().message());
  r->nproc = *nproc;
  if (int rc = CheckValues(f, *nproc, &r->checked); rc >= 0) return rc;
  std::string backend = ToLower(f.rdzv_backend);
  if (backend != "store" && backend != "c10d" && backend != "static" && backend != "etcd" &&
      backend != "etcd-v2") {
    return RunFailed(kExitInvalidValue,
                fmt::format("--rdzv-backend '{}' is not supported (use store, the default, or "
                            "etcd; c10d is an alias of store, etcd-v2 of etcd)",
                            f.rdzv_backend));
  }
  // etcd: the agents rendezvous in etcd (v3 API, docs/etcd.md); --standalone overrides it.
  r->use_etcd = (backend == "etcd" || backend == "etcd-v2") && !f.standalone;
  std::string rdzv_conf = f.rdzv_conf;
  if (r->use_etcd) {
    if (Status s = PlanEtcd(store_flags, &r->etcd, &rdzv_conf); !s.ok()) return RunFailed(s);
  }
  r->rdzv.min_nodes = nnodes->first;
  r->rdzv.max_nodes = nnodes->second;
  r->etcd.peers = nnodes->second;
  r->rdzv.max_restarts = f.max_restarts;
  r->rdzv.standby = f.standby;
  if (f.standby && r->rdzv.max_nodes <= 1) {
    return RunFailed(kExitInvalidValue, "--standby waits to replace a lost node of a multi-node "
                                   "job: give --nnodes MIN:MAX with MAX above 1");
  }
  if (Status s = ApplyRdzvConf(rdzv_conf, r->rdzv, r->is_host); !s.ok()) {
    return RunFailed(kExitInvalidValue, s.message());
  }
  if (f.standalone && r->rdzv.max_nodes > 1) {
    return RunFailed(kExitInvalidValue, "--standalone runs one node; drop it or use --nnodes 1");
  }
  auto argv = WorkerArgv(f, r->program, &r->entrypoint_note, &r->program_at);
  if (!argv.ok()) {
    int code = argv.status().code() == StatusCode::kNotFound ||
                       argv.status().code() == StatusCode::kPermissionDenied
                   ? kExitNotFound
                   : kExitInvalidValue;
    return RunFailed(code, argv.status().message());
  }
  r->argv = *argv;
  if (r->f.log_dir.empty()) {
    // This user's own log directory ($TMPDIR/cohort-logs-<uid>, mode 0700): the logs of one
    // user's jobs are not readable by another, and no user's directory blocks another's.
    auto logs = UserPrivateDir("", "cohort-logs");
    if (!logs.ok()) {
      return RunFailed(kExitInvalidValue, fmt::format("the default log directory cannot be used: "
                                                 "{}; or pass --log-dir DIR",
                                                 logs.status().message()));
    }
    r->f.log_dir = *logs;
  }
  r->single = r->rdzv.max_nodes == 1;
  if (Status s = PlanStore(store_flags, r->use_etcd, r->single, r->is_host, &r->plan); !s.ok()) {
    return RunFailed(s);
  }
  r->rdzv.run_id = f.rdzv_id;
  r->own_run_id = f.rdzv_id == "none" && (f.standalone || r->single);
  if (r->own_run_id) r->rdzv.run_id = "cohort-" + RandomHex(6);
  if (r->use_etcd) {
    r->etcd.prefix = r->rdzv.run_id;  // the job's keys: also what is removed at the end
    if (r->rdzv.run_id == "none") {
      COHORT_LOG_WARN("cli", "--rdzv-id is 'none': every job on this etcd that does the same "
                      "shares its keys; give each job its own --rdzv-id");
    }
  }
  if (r->single && f.master_port > 0) {
    auto probe = net::Listen({.host = "0.0.0.0", .port = f.master_port, .reuse_addr = true});
    if (!probe.ok()) {
      return RunFailed(kExitPortInUse,
                  fmt::format("--master-port {} is already in use on this machine; pick another "
                              "port or leave it out to get a free one",
                              f.master_port));
    }
  }
  return -1;
}

// The agent's options: the worker group, this node, the rendezvous and the job's store
// (reached at `store_addr`; `serving`: this agent's server holds it).
agent::AgentOptions AgentOptionsFor(const ResolvedRun& r, const std::string& store_addr,
                                    bool serving, StoreConnector* connect_within) {
  const RunFlags& f = r.f;
  agent::AgentOptions o;
  o.spec.argv = r.argv;
  o.spec.entrypoint_note = r.entrypoint_note;
  AddPythonSupport(f, r.argv, r.program_at, o.spec);
  o.spec.nproc_per_node = r.nproc;
  o.spec.role = f.role;
  o.spec.max_restarts = f.max_restarts;
  o.spec.run_id = r.rdzv.run_id;
  o.spec.log_dir = f.log_dir;  // Resolve chose this user's directory when none was given
  o.spec.redirects = r.checked.redirects;
  o.spec.tee = r.checked.tee;
  o.spec.local_ranks_filter = r.checked.local_ranks_filter;
  o.spec.master_addr = f.master_addr;
  o.spec.master_port = f.master_port;
  o.spec.stop_grace = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(f.stop_grace));
  o.spec.log_merge_window = std::chrono::milliseconds(std::max(0, f.log_merge_ms));
  o.rdzv = r.rdzv;
  o.self.host = net::HostName();
  o.self.addr = !f.local_addr.empty() ? f.local_addr
                : r.single      ? std::string("127.0.0.1")
                                : net::ResolveIpv4(o.self.host).value_or(o.self.host);
  o.self.local_world_size = r.nproc;
  // libcohort in the workers listens for its peers on this node's address (or the one the
  // user chose with COHORT_LISTEN_ADDR).
  o.spec.listen_addr = worker_env::Inherited(worker_env::kListenAddr).value_or(o.self.addr);
  o.spec.flight_recorder_dir =
      worker_env::Inherited(worker_env::kFlightRecorderDir).value_or("");
  WireJobStore(r.plan, store_addr, r.use_etcd, serving, r.etcd, r.rdzv.join_timeout, o,
               connect_within);
  o.serves_store = serving && !r.use_etcd;
  return o;
}

}  // namespace

int RunCommand(const std::vector<std::string>& args) {
  // 1. Resolve: flags, environment and plans; nothing starts before every value is valid.
  ResolvedRun r;
  if (int rc = ParseRunFlags(args, &r); rc >= 0) return rc;
  if (int rc = Resolve(&r); rc >= 0) return rc;

  // 2. Serve the store, or join the agent that does.
  std::unique_ptr<store::StoreServer> server;
  std::string local_store_addr;  // how this node reaches the store it serves (or joins here)
  if (r.plan.serve) {
    if (Status s = ServeOrJoinStore(r.plan, r.rdzv, r.single, &server, &local_store_addr);
        !s.ok()) {
      return RunFailed(s);
    }
  }

  // 3. The agent, and its monitoring: workers export their metrics under the run's log
  // directory; the endpoint serves them with the agent's own. A failure there never stops
  // the job.
  StoreConnector connect_within;
  agent::AgentOptions o = AgentOptionsFor(r, r.plan.serve ? local_store_addr : r.plan.host,
                                          server != nullptr, &connect_within);
  metrics::StatusBoard status;
  metrics::EventLog events(2000);
  std::unique_ptr<metrics::JobView> job_view;
  std::unique_ptr<metrics::MetricsServer> metrics_server =
      r.f.metrics_port >= 0
          ? StartMetrics(r.f, r.rdzv.run_id, status, events, connect_within, &job_view, o)
          : nullptr;

  // 4. Run until the job ends here.
  agent::AgentResult result = agent::Agent(std::move(o)).Run();
  if (metrics_server) metrics_server->Stop();
  if (server) server->Stop();
  if (r.use_etcd && r.single && r.own_run_id && result.exit_code != kExitRendezvous) {
    RemoveEtcdKeys(r.etcd);
  }
  if (!result.summary.empty()) fmt::print(stderr, "{}\n", result.summary);
  return result.exit_code;
}

}  // namespace cohort::cli
