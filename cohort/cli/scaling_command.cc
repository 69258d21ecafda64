// `cohort bench scaling [--workers 1,2,4 | --max-workers N] [--out DIR] -- <training command>`:
// runs the command under `cohort run --nproc-per-node K` for each K, reads the ranks'
// exported metrics (COHORT_METRICS_DIR, see cohort/metrics/exporter.h), and prints a table
// of samples/s, epoch time, speed-up and efficiency against linear scaling; writes the
// table as JSON and a plot as SVG into DIR.
//
// `--nodes 1,2,3` varies hosts instead: for each count N, N hosts each run one agent
// (`cohort run --nnodes N --nproc-per-node P`) that meet through the store served by the
// first; every rank of every host exports its metrics into one directory (on a shared file
// system, as checkpoints are). The efficiency is then per node. The hosts are
// network-namespace hosts of this machine (`--hosts netns`, netns_hosts.h, root), or the
// nodes of the Slurm allocation the command runs in (`--hosts slurm`, the default inside
// one: one `srun --nodes=N --ntasks-per-node=1` step per count).
//
// Throughput is the sum over ranks of each rank's mean cohort_train_samples_per_second over
// its snapshots after the first quarter of the run (start-up excluded); epoch time comes
// from rank 0's cohort_train_epoch over the same span. A command that exports no such
// metrics still gets its wall time per run.
//
// Thread-safety: main thread only.
#include "cohort/cli/scaling_command.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstring>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/base/exit_codes.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/worker_env.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/netns_hosts.h"
#include "cohort/net/socket.h"

namespace cohort::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Row {
  int workers = 0;  // the count varied: workers, or nodes with --nodes
  int exit_code = 0;
  double wall_s = 0;
  double samples_per_s = -1;  // -1: not reported
  double epoch_s = -1;
};

double MetricValue(const json& metrics, const std::string& name) {
  for (const auto& m : metrics) {
    if (m.value("name", "") == name && m.contains("value")) return m["value"].get<double>();
  }
  return -1;
}

// Reads <dir>/rank<R>.jsonl of every rank; fills samples/s and epoch time.
void ReadRun(const std::string& dir, Row* row) {
  double total = 0;
  bool any = false;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".jsonl") continue;
    std::vector<std::pair<double, json>> snaps;
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      snaps.emplace_back(j.value("time", 0.0), j.value("metrics", json::array()));
    }
    if (snaps.size() < 2) continue;
    const size_t from = snaps.size() / 4;
    double sum = 0;
    int n = 0;
    for (size_t i = from; i < snaps.size(); ++i) {
      double v = MetricValue(snaps[i].second, "cohort_train_samples_per_second");
      if (v > 0) {
        sum += v;
        ++n;
      }
    }
    if (n > 0) {
      total += sum / n;
      any = true;
    }
    if (entry.path().stem() == "rank0") {
      double e0 = MetricValue(snaps[from].second, "cohort_train_epoch");
      double e1 = MetricValue(snaps.back().second, "cohort_train_epoch");
      double dt = snaps.back().first - snaps[from].first;
      if (e0 >= 0 && e1 > e0 && dt > 0) row->epoch_s = dt / (e1 - e0);
    }
  }
  if (any) row->samples_per_s = total;
}

std::string Svg(const std::vector<Row>& rows, const std::string& unit) {
  const double w = 560, h = 360, left = 60, bottom = 310, top = 30, right = 530;
  int max_k = 1;
  double max_v = 1;
  double base = -1;
  for (const auto& r : rows) {
    max_k = std::max(max_k, r.workers);
    if (r.samples_per_s > 0) {
      if (base < 0) base = r.samples_per_s / r.workers;
      max_v = std::max(max_v, r.samples_per_s);
    }
  }
  if (base > 0) max_v = std::max(max_v, base * max_k);
  auto x = [&](double k) { return left + (right - left) * (k - 1) / std::max(1, max_k - 1); };
  auto y = [&](double v) { return bottom - (bottom - top) * v / max_v; };
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"{}\" y=\"18\" font-size=\"14\">samples/s against {} "
      "(dashed: linear)</text>\n<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n"
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n",
      w, h, left, unit, left, bottom, right, bottom, left, bottom, left, top);
  for (const auto& r : rows) {
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                       x(r.workers), bottom + 18, r.workers);
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     (left + right) / 2, bottom + 40, unit);
  for (int i = 0; i <= 4; ++i) {
    double v = max_v * i / 4;
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}</text>\n",
                       left - 6, y(v) + 4, v);
  }
  if (base > 0) {
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                       "stroke=\"#999\" stroke-dasharray=\"6,4\"/>\n",
                       x(1), y(base), x(max_k), y(base * max_k));
  }
  std::string points;
  for (const auto& r : rows) {
    if (r.samples_per_s <= 0) continue;
    points += fmt::format("{:.1f},{:.1f} ", x(r.workers), y(r.samples_per_s));
    out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"#1a55c4\"/>\n",
                       x(r.workers), y(r.samples_per_s));
  }
  if (!points.empty()) {
    out += "<polyline fill=\"none\" stroke=\"#1a55c4\" stroke-width=\"2\" points=\"" +
           std::string(Trim(points)) + "\"/>\n";
  }
  return out + "</svg>\n";
}

std::string SelfExe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("cohort") : p.string();
}

// "1,2,4" into counts; nullopt when it is not such a list.
std::optional<std::vector<int>> ParseCounts(const std::string& text) {
  std::vector<int> counts;
  for (const auto& part : Split(text, ',')) {
    auto v = ParseInt64(std::string(Trim(part)));
    if (!v || *v < 1 || *v > 4096) return std::nullopt;
    counts.push_back(static_cast<int>(*v));
  }
  return counts;
}

// Waits for every process of one run and reaps them; the first failure (or the last exit)
// is the run's. Past `timeout`, or on a signal from `signal_fd` (its number goes to
// `*interrupted`), every process group gets SIGTERM, and SIGKILL 10 s later.
ExitStatus WaitAll(std::vector<Child>& children, double timeout, const std::string& what,
                   int signal_fd, int* interrupted) {
  Deadline stop_at = Deadline::After(std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(timeout)));
  std::vector<bool> done(children.size(), false);
  ExitStatus result;
  bool failed = false, stopping = false;
  auto stop = [&](const std::vector<size_t>& idx) {
    for (size_t i : idx) SignalGroup(children[i].pid, stopping ? SIGKILL : SIGTERM);
    stopping = true;
    stop_at = Deadline::AfterMs(10000);
  };
  for (size_t left = children.size(); left > 0;) {
    std::vector<pollfd> fds;
    std::vector<size_t> idx;
    for (size_t i = 0; i < children.size(); ++i) {
      if (!done[i]) {
        fds.push_back({children[i].pidfd, POLLIN, 0});
        idx.push_back(i);
      }
    }
    fds.push_back({signal_fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), stop_at.PollTimeoutMs()) == 0) {
      if (!stopping) {
        fmt::print(stderr, "cohort bench scaling: {} ran past --timeout {} s; stopped\n", what,
                   timeout);
      }
      stop(idx);
      continue;
    }
    if (fds.back().revents) {
      signalfd_siginfo si{};
      if (::read(signal_fd, &si, sizeof(si)) == sizeof(si) && !stopping) {
        *interrupted = static_cast<int>(si.ssi_signo);
        fmt::print(stderr, "cohort bench scaling: {}: stopping {}\n", strsignal(*interrupted),
                   what);
        stop(idx);
      }
    }
    for (size_t k = 0; k + 1 < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      Child& c = children[idx[k]];
      ExitStatus st = Reap(c.pid);
      ::close(c.pidfd);
      done[idx[k]] = true;
      --left;
      if (!failed) result = st;
      failed = failed || !st.success();
    }
  }
  return result;
}

// Where the runs of `--nodes` go (nothing: `--workers` on this node).
struct Placement {
  const NetnsHosts* netns = nullptr;  // network-namespace hosts of this machine
  bool slurm = false;                 // the nodes of this Slurm allocation
  int nproc = 1;                      // workers per node
  bool nodes() const { return netns || slurm; }
};

// The Slurm step of one run: the agent on the step's first node serves the store; every
// agent learns that node's address (NodeAddr, else its name) from scontrol, as the batch
// scripts of the slurm backend do, and is told whether it is the store's host.
SpawnOptions SlurmStep(int k, const std::vector<std::string>& agent_argv, int port) {
  const std::string script = fmt::format(
      "first=$(scontrol show hostnames \"$SLURM_STEP_NODELIST\" | head -n 1)\n"
      "addr=$(scontrol show node -o \"$first\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')\n"
      "addr=${{addr:-$first}}\n"
      "if [ \"${{SLURM_NODEID:-0}}\" = 0 ]; then h=1; else h=0; fi\n"
      "export PET_RDZV_CONF=\"is_host=$h\"\n"
      "exec \"$1\" \"$2\" --rdzv-endpoint \"$addr:{}\" \"${{@:3}}\"\n",
      port);
  SpawnOptions so;
  so.argv = {"srun", fmt::format("--nodes={}", k), fmt::format("--ntasks={}", k),
             "--ntasks-per-node=1", "--kill-on-bad-exit=0", "/bin/bash", "-c", script,
             "cohort-agent"};
  so.argv.insert(so.argv.end(), agent_argv.begin(), agent_argv.end());
  return so;
}

// A port for the store of a Slurm run: free here (where salloc's shell usually runs, on
// the allocation's first node), else one from the ephemeral range's lower half.
int StorePort() {
  auto sock = net::ReservePort("0.0.0.0", 0);
  if (sock.ok()) {
    if (auto port = sock->LocalPort(); port.ok()) return *port;
  }
  return 20000 + static_cast<int>(std::stoul(RandomHex(2), nullptr, 16) % 10000);
}

// Runs `command` under `cohort run --nproc-per-node k`, or on k nodes (`where`) with
// where.nproc workers each, with its own log and metrics directories under `out`; an error
// only when the run could not start.
Result<Row> RunAtCount(int k, const std::vector<std::string>& command, const std::string& out,
                       double timeout, const Placement& where, int signal_fd,
                       int* interrupted) {
  Row row;
  row.workers = k;
  const std::string run_dir = fmt::format("{}/{}{}", out, where.nodes() ? "nodes" : "workers", k);
  std::error_code ec;
  fs::remove_all(run_dir, ec);
  fs::create_directories(run_dir + "/metrics", ec);
  // The workers of that run inherit these (worker_env.h) and export their metrics there.
  std::vector<std::pair<std::string, std::string>> env = {
      {worker_env::kMetricsDir, run_dir + "/metrics"}, {worker_env::kMetricsHistory, "1"}};
  std::vector<SpawnOptions> runs;
  std::vector<std::string> host_ids;  // per run, netns only
  if (!where.nodes()) {
    SpawnOptions so;
    so.argv = {SelfExe(), "run", "--nproc-per-node", std::to_string(k), "--log-dir",
               run_dir + "/logs", "--"};
    so.argv.insert(so.argv.end(), command.begin(), command.end());
    so.output_file = run_dir + "/output.log";
    runs.push_back(so);
    fmt::print(stderr, "cohort bench scaling: {} worker(s)...\n", k);
  } else {
    // One agent per host, meeting through the store the first host serves; the job's
    // token is shared through the environment.
    env.emplace_back(worker_env::kToken, RandomHex(16));
    const std::string id = fmt::format("scaling-{}-{}", k, RandomHex(4));
    auto agent_argv = [&](const std::string& log_dir) {
      return std::vector<std::string>{SelfExe(), "run", "--nnodes", std::to_string(k),
                                      "--nproc-per-node", std::to_string(where.nproc),
                                      "--rdzv-backend", "c10d", "--rdzv-id", id, "--log-dir",
                                      log_dir};
    };
    if (where.slurm) {
      std::vector<std::string> argv = agent_argv(run_dir + "/logs");
      argv.push_back("--");
      argv.insert(argv.end(), command.begin(), command.end());
      SpawnOptions so = SlurmStep(k, argv, StorePort());
      so.output_file = run_dir + "/output.log";
      runs.push_back(so);
    } else {
      const NetnsHosts& hosts = *where.netns;
      for (int i = 0; i < k; ++i) {
        std::vector<std::string> argv = agent_argv(fmt::format("{}/logs/node{}", run_dir, i));
        argv.insert(argv.end(), {"--rdzv-endpoint", hosts.addr(0) + ":29400", "--local-addr",
                                 hosts.addr(i), "--"});
        argv.insert(argv.end(), command.begin(), command.end());
        SpawnOptions so;
        so.argv = hosts.On(i, argv);
        so.output_file = fmt::format("{}/output-node{}.log", run_dir, i);
        runs.push_back(so);
        // The namespaces share this machine's boot id: each is told it is a host of its
        // own, so that its ranks reach the others over the network, as separate machines
        // would.
        host_ids.push_back(hosts.name(i));
      }
    }
    fmt::print(stderr, "cohort bench scaling: {} node(s) x {} worker(s)...\n", k, where.nproc);
  }
  const auto start = SteadyClock::now();
  std::vector<Child> children;
  for (size_t i = 0; i < runs.size(); ++i) {
    SpawnOptions& so = runs[i];
    auto run_env = env;
    if (i < host_ids.size()) run_env.emplace_back("COHORT_HOST_ID", host_ids[i]);
    so.env = MergeEnvironment(run_env);
    so.new_session = true;  // its own process group: stopped as a whole at the timeout
    auto child = Spawn(so);
    if (!child.ok()) {
      int ignored = 0;
      for (auto& c : children) SignalGroup(c.pid, SIGKILL);
      WaitAll(children, 30, "the run", signal_fd, &ignored);
      return child.status();
    }
    children.push_back(*child);
  }
  const std::string what =
      where.nodes() ? fmt::format("{} node(s)", k) : fmt::format("{} worker(s)", k);
  ExitStatus st = WaitAll(children, timeout, what, signal_fd, interrupted);
  row.wall_s = SecondsSince(start);
  row.exit_code = st.exited ? st.code : ExitCodeForSignal(st.signal);
  ReadRun(run_dir + "/metrics", &row);
  if (!st.success()) {
    fmt::print(stderr, "cohort bench scaling: {} failed ({}); see {}/output*.log\n", what,
               st.Describe(), run_dir);
  }
  return row;
}

// The table on stdout, scaling.json and scaling.svg in `out`.
void Report(const std::vector<Row>& rows, const std::string& out, const std::string& unit) {
  const Row* first = nullptr;
  for (const auto& r : rows) {
    if (r.samples_per_s > 0) {
      first = &r;
      break;
    }
  }
  json table = json::array();
  fmt::print("{:>8} {:>12} {:>10} {:>9} {:>11} {:>8}  {}\n", unit, "samples/s", "epoch s",
             "speed-up", "efficiency", "wall s", "exit");
  auto or_null = [](double v) { return v < 0 ? json(nullptr) : json(v); };
  for (const auto& r : rows) {
    double speedup = first && r.samples_per_s > 0 ? r.samples_per_s / first->samples_per_s : -1;
    double eff = speedup > 0 ? speedup / (double(r.workers) / first->workers) : -1;
    auto num = [](double v, int d) {
      return v < 0 ? std::string("-") : fmt::format("{:.{}f}", v, d);
    };
    fmt::print("{:>8} {:>12} {:>10} {:>9} {:>11} {:>8.1f}  {}\n", r.workers,
               num(r.samples_per_s, 0), num(r.epoch_s, 2), num(speedup, 2),
               eff < 0 ? std::string("-") : fmt::format("{:.0f}%", 100 * eff), r.wall_s,
               r.exit_code);
    table.push_back({{unit, r.workers},
                     {"samples_per_s", or_null(r.samples_per_s)},
                     {"epoch_s", or_null(r.epoch_s)},
                     {"speedup", or_null(speedup)},
                     {"efficiency", or_null(eff)},
                     {"wall_s", r.wall_s},
                     {"exit_code", r.exit_code}});
  }
  std::ofstream(out + "/scaling.json") << table.dump(1) << "\n";
  std::ofstream(out + "/scaling.svg") << Svg(rows, unit);
  const char* one = unit == "nodes" ? "node" : "worker";
  fmt::print("# efficiency: samples/s per {} against the {}-{} run; table in "
             "{}/scaling.json, plot in {}/scaling.svg\n",
             one, first ? first->workers : 1, one, out, out);
}

// --hosts slurm runs inside an allocation with as many nodes as the largest count.
Status InSlurmAllocation(const std::vector<int>& counts, const std::string& nodes_text) {
  const std::optional<std::string> job = SystemEnv("SLURM_JOB_ID");
  const int have =
      static_cast<int>(ParseInt64(SystemEnv("SLURM_JOB_NUM_NODES").value_or("")).value_or(0));
  const int need = *std::max_element(counts.begin(), counts.end());
  if (job && have >= need) return Status::Ok();
  return InvalidArgument("--hosts slurm runs inside a Slurm allocation of at least {} node(s) "
                         "(this one: {}); e.g. salloc -N {} cohort bench scaling --nodes {} -- ...",
                         need, job ? std::to_string(have) : std::string("none"), need, nodes_text);
}

}  // namespace

int ScalingCommand(const std::vector<std::string>& args) {
  // Split at "--": our options before, the training command after.
  auto dash = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> ours(args.begin(), dash);
  std::vector<std::string> command(dash == args.end() ? dash : dash + 1, args.end());
  CLI::App app("Run a training command at several worker counts and report the scaling.",
               "cohort bench scaling");
  std::string workers_text, out_dir = "cohort-scaling";
  int max_workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double timeout = 3600;
  app.add_option("--workers", workers_text, "worker counts, e.g. 1,2,4 (default 1..max)");
  app.add_option("--max-workers", max_workers, "run 1..N workers")->check(CLI::PositiveNumber);
  app.add_option("--out", out_dir, "directory for scaling.json, scaling.svg and the logs");
  app.add_option("--timeout", timeout, "seconds each run may take");
  std::string nodes_text;
  int nproc = 1;
  app.add_option("--nodes", nodes_text,
                 "node counts, e.g. 1,2,3: one agent per network-namespace host (root)");
  app.add_option("--nproc-per-node", nproc, "workers per node with --nodes")
      ->check(CLI::Range(1, 1024));
  std::string hosts_kind = SystemEnv("SLURM_JOB_ID") ? "slurm" : "netns";
  app.add_option("--hosts", hosts_kind,
                 "with --nodes: netns (network-namespace hosts of this machine, root) or slurm "
                 "(the nodes of this allocation; the default inside one)")
      ->check(CLI::IsMember({"netns", "slurm"}));
  app.footer("Usage: cohort bench scaling [options] -- <training command>");
  if (int rc = ParseCommandLine(app, ours, "bench scaling"); rc >= 0) return rc;
  if (command.empty()) {
    fmt::print(stderr, "cohort bench scaling: no training command: cohort bench scaling "
                       "[options] -- <program> [args]\n");
    return kExitUsage;
  }
  std::vector<int> counts;
  if (!nodes_text.empty()) {
    auto parsed = ParseCounts(nodes_text);
    if (!parsed || !workers_text.empty()) {
      fmt::print(stderr, "cohort bench scaling: --nodes '{}' is not a list of node counts such "
                         "as 1,2,3 (and does not go with --workers)\n",
                 nodes_text);
      return kExitInvalidValue;
    }
    counts = *parsed;
  } else if (!workers_text.empty()) {
    auto parsed = ParseCounts(workers_text);
    if (!parsed) {
      fmt::print(stderr, "cohort bench scaling: --workers '{}' is not a list of counts "
                         "such as 1,2,4\n",
                 workers_text);
      return kExitInvalidValue;
    }
    counts = *parsed;
  } else {
    for (int k = 1; k <= max_workers; ++k) counts.push_back(k);
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) {
    fmt::print(stderr, "cohort bench scaling: cannot create {}: {}\n", out_dir, ec.message());
    return kExitInvalidValue;
  }
  const std::string out = fs::absolute(out_dir).string();
  if (!nodes_text.empty() && hosts_kind == "slurm") {
    if (Status in = InSlurmAllocation(counts, nodes_text); !in.ok()) {
      return CommandFailed("bench scaling", in, kExitInvalidValue);
    }
  }
  const int signal_fd = SignalFd();
  int interrupted = 0;
  std::vector<Row> rows;
  for (int k : counts) {
    std::unique_ptr<NetnsHosts> hosts;
    if (!nodes_text.empty() && hosts_kind == "netns") {
      auto made = NetnsHosts::Create(k);
      if (!made.ok()) {
        const bool root = made.status().code() == StatusCode::kFailedPrecondition;
        return CommandFailed("bench scaling", made.status(),
                             root ? kExitInvalidValue : kExitInternal);
      }
      hosts = std::move(*made);
    }
    const Placement where{.netns = hosts.get(),
                          .slurm = !nodes_text.empty() && hosts_kind == "slurm",
                          .nproc = nproc};
    auto row = RunAtCount(k, command, out, timeout, where, signal_fd, &interrupted);
    if (!row.ok()) return CommandFailed("bench scaling", row.status(), kExitInternal);
    rows.push_back(*row);
    if (interrupted) break;  // the hosts of this count are removed as `hosts` goes
  }
  Report(rows, out, nodes_text.empty() ? "workers" : "nodes");
  if (interrupted) return ExitCodeForSignal(interrupted);
  bool all_ok =
      std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.exit_code == 0; });
  return all_ok ? kExitOk : kExitWorkerFailed;
}

}  // namespace cohort::cli
