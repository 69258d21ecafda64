// Implements the elastic agent (see agent.h for the thread model). Only the monitor thread
// touches workers_, the log sinks and the rendezvous object; the watcher and the signal
// guard share nothing with it but an eventfd, an atomic and a store connection of their own.
#include "cohort/agent/agent.h"

#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cohort/agent/job_directory.h"
#include "cohort/agent/log_sink.h"
#include "cohort/agent/zygote.h"
#include "cohort/base/event_fd.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/base/flight_record.h"
#include "cohort/base/log.h"
#include "cohort/base/membership_channel.h"
#include "cohort/base/mutex.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/sweeper.h"
#include "cohort/net/socket.h"
#include "cohort/store/torch_store_server.h"

namespace cohort::agent {

namespace fs = std::filesystem;
using rendezvous::FailureRecord;
using rendezvous::Rendezvous;
using rendezvous::RoundEnd;
using rendezvous::RendezvousInfo;

namespace {
constexpr const char* kLog = "agent";
// A key of every round's torch store holding the round's number: cohort_torch.live checks
// it when it re-forms, so a worker never joins the next round's store with this round's rank.
// (torch's TCPStore client puts "/" before every key: its "cohort/round".)
constexpr std::string_view kTorchStoreRoundKey = "/cohort/round";

sigset_t AgentSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

bool IsTermination(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP; }

// Reads the "message" of a PyTorch @record error file; empty when absent or unreadable.
std::string ReadErrorFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return "";
  const auto& m = j["message"];
  if (m.is_string()) return m.get<std::string>();
  if (m.is_object() && m.contains("message") && m["message"].is_string()) {
    return m["message"].get<std::string>();
  }
  return m.dump();
}

}  // namespace

std::string_view WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kInit: return "INIT";
    case WorkerState::kHealthy: return "HEALTHY";
    case WorkerState::kUnhealthy: return "UNHEALTHY";
    case WorkerState::kStopped: return "STOPPED";
    case WorkerState::kSucceeded: return "SUCCEEDED";
    case WorkerState::kFailed: return "FAILED";
  }
  return "UNKNOWN";
}

void BlockAgentSignals() {
  sigset_t set = AgentSignals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

class Agent::Impl {
 public:
  explicit Impl(AgentOptions options) : o_(std::move(options)) {}
  ~Impl() {
    StopWorkers(SIGKILL);
    if (signal_fd_ >= 0) ::close(signal_fd_);
  }
  // Offered when the job may span nodes (a membership can change without a failure) and
  // not switched off.
  bool LiveOffered() const { return o_.rdzv.max_nodes > 1 && settings::kLiveReconfig.Get(); }
  Duration ReconfigTimeout() const {
    return std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(std::max(settings::kReconfigTimeout.Get(), 0.1)));
  }

  // Runs the rounds, then records how this agent ended in the job's directory.
  AgentResult Run();

 private:
  AgentResult RunRounds();
  // The job's directory (job_directory.h), when this agent serves a metrics endpoint.
  void PublishEndpoint();
  void PublishEnd(const AgentResult& result);
  int directory_index_ = 0;  // this agent's entry; 0: not published
  // The steps of RunRounds, in order. Setup opens the signal fd, the store and the zygote; a
  // result is the agent's answer (it could not start).
  std::optional<AgentResult> Setup();
  // A warm spare (--standby with a warm interpreter): waits (bounded) until the
  // interpreter is ready; a result only when a termination signal came meanwhile.
  std::optional<AgentResult> WarmUpSpare();
  // Remembers the round and publishes it (metrics, events, log). `first`: the job's first
  // round here; `live`: the workers stay and re-form in it.
  void RecordRound(const RendezvousInfo& info, bool first, bool live);
  // Every local worker succeeded: record it, then serve the store until the job ends when
  // this node hosts it.
  AgentResult Succeeded(const RendezvousInfo& info);
  // A local worker failed: report, stop the group, end the round. A result ends the agent;
  // none means the next round follows.
  std::optional<AgentResult> Failed(const RendezvousInfo& info);
  struct Worker {
    int local_rank = 0;
    int rank = 0;
    Child child;
    bool alive = false;
    ExitStatus status;
    std::unique_ptr<LogSink> out, err;
    std::string error_file;
  };
  // kPeerLost: a local worker reported that a peer went away (lost_); kReformTimedOut: the
  // workers did not re-form in the announced round by the deadline.
  enum class Outcome { kSucceeded, kFailed, kRoundEnded, kSignaled, kPeerLost, kReformTimedOut };

  // Live reconfiguration (docs/multinode.md). Whether the workers stay through the end of
  // the round for `why`: a join or a dead node, every local worker alive and ready, and
  // enough nodes left; otherwise they are stopped and restarted (today's path).
  bool KeepWorkers(const RoundEnd& why, const RendezvousInfo& info);
  // Tells each kept worker its place in the new round (notice.L) and sets the deadline by
  // which they must have re-formed. False when they cannot be kept after all (one exited):
  // they are stopped and the caller starts the group afresh.
  bool Announce(const RendezvousInfo& info, int round_end_fd);
  // Reads the channel after an inotify event: returns kPeerLost for a lost-peer report of
  // the current round, and notes when every worker formed in the announced round.
  std::optional<Outcome> ReadChannel();
  // Ends the round after a worker's lost-peer report (as a dead node: the others re-form
  // without it). A result ends the agent.
  std::optional<AgentResult> EndForLostPeer(const RendezvousInfo& info);

  // Runs a blocking store call while a guard thread turns a terminating signal into an
  // abort of the store, so no rendezvous wait ever ignores Ctrl-C.
  template <typename Fn>
  auto Guarded(Fn fn) -> decltype(fn());
  // `round_end_fd`: the round watcher's notice (readable once the round ended elsewhere):
  // the wait for node 0's MASTER_PORT lasts only as long as the round.
  Result<std::pair<std::string, int>> MasterEndpoint(const RendezvousInfo& info,
                                                     int round_end_fd);
  Status StartWorkers(const RendezvousInfo& info, int round_end_fd);
  // The membership channel of a new worker group (in its attempt directory), watched with
  // inotify; on an error the workers are not offered one (they restart on any change).
  void OpenChannel();
  // OMP_NUM_THREADS for the workers (0: not set).
  int OmpThreadsForWorkers() const;
  // Starts the warm interpreter (WorkerSpec::warm), or says why workers will start fresh.
  void StartZygote();
  // A worker from the warm interpreter when there is one, else a fresh process.
  Result<Child> SpawnWorker(const SpawnOptions& so);
  Outcome Monitor(int watch_fd);
  // How long Monitor's poll may sleep: until console lines are due to be merged or the
  // re-formation deadline; -1 (only events) when neither.
  int MonitorTimeoutMs() const;
  void OnWorkerExit(Worker& w);
  void StopWorkers(int first_signal);
  void ForwardSignal(int sig);
  void CloseWorkerPipes(Worker& w);
  AgentResult FailureResult(const std::string& why);
  // After a failure in a libcohort job: asks the live workers for their flight recorders
  // (SIGUSR1), and reports each local rank's last collective ("rank 1: allreduce #4
  // completed" beside "rank 0: allreduce #5 failed") — which ranks did not enter which
  // collective. Empty when the workers do not use libcohort.
  std::string CollectFlightRecords(const FailureRecord& failure);

  AgentOptions o_;
  int signal_fd_ = -1;
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<Rendezvous> rdzv_;
  std::vector<Worker> workers_;
  net::Socket reserved_port_;
  int reserved_port_number_ = 0;
  std::unique_ptr<store::TorchStoreServer> torch_store_;  // node 0: the round's MASTER_PORT
  std::unique_ptr<Zygote> zygote_;  // the warm interpreter, while it serves
  bool subreaper_ = false;          // set by the zygote's start; it stays for our lifetime
  std::atomic<int> terminating_signal_{0};
  std::optional<FailureRecord> failure_;  // first failure of the current attempt
  std::unique_ptr<JobSweeper> sweeper_;   // kills what the workers leave behind
  int64_t last_round_ = -1;
  int starts_ = 0;  // worker-group starts (attempt directories)
  std::string attempt_dir_;
  // The membership channel of the running group (empty: not offered) and its inotify fd;
  // the secret its messages carry (membership_channel.h), one per agent.
  std::string membership_dir_;
  const std::string membership_secret_ = RandomHex(16);
  std::string runtime_dir_;  // private (0700), removed by the sweeper's helper
  // The node's snapshot directory (COHORT_SNAPSHOT_DIR), in shared memory: named with the
  // job's cookie, so the sweeper's helper removes it when the agent ends, however it ends.
  std::string snapshot_dir_;
  void MakeSnapshotDir();
  int64_t live_reforms_ = 0;  // rounds the workers joined in place (announced to them)
  std::unique_ptr<membership_channel::ChannelWatch> channel_;
  std::optional<LostPeerReport> lost_;      // the report that ended the round
  std::optional<Deadline> reform_deadline_;  // while announced workers have not re-formed
  SteadyClock::time_point reform_started_;
  // Where rank `rank` dumps its flight record: the user's directory, else its log directory.
  std::string FlightRecordDir(int rank) const {
    return o_.spec.flight_recorder_dir.empty() ? fmt::format("{}/{}", attempt_dir_, rank)
                                               : o_.spec.flight_recorder_dir;
  }
  std::string stall_report_;  // CollectFlightRecords of the latest failure
  WorkerState state_ = WorkerState::kInit;
  std::unique_ptr<ConsoleMerger> out_console_, err_console_;
  std::optional<RendezvousInfo> info_;  // the current round, for PublishStatus
  // Monitoring (AgentOptions::status / events): the dashboard's view of this agent.
  // The agent's state for the dashboard, and the running-workers gauge.
  void PublishStatus();
  // One worker's cohort_agent_worker_up gauge (set on start and exit).
  void PublishWorker(const Worker& w);
  void AddEvent(nlohmann::json event) {
    if (o_.events) o_.events->Add(std::move(event));
  }
};

Agent::Agent(AgentOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Agent::~Agent() = default;
AgentResult Agent::Run() { return impl_->Run(); }

template <typename Fn>
auto Agent::Impl::Guarded(Fn fn) -> decltype(fn()) {
  EventFd stop;
  std::thread guard([&] {
    pthread_setname_np(pthread_self(), "rdzv-signal");
    for (;;) {
      pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {stop.fd(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[1].revents) return;
      signalfd_siginfo si{};
      while (::read(signal_fd_, &si, sizeof(si)) == sizeof(si)) {
        if (IsTermination(static_cast<int>(si.ssi_signo))) {
          terminating_signal_ = static_cast<int>(si.ssi_signo);
          store_->Abort();
          return;
        }
      }
    }
  });
  auto result = fn();
  stop.Notify();
  guard.join();
  return result;
}

Result<std::pair<std::string, int>> Agent::Impl::MasterEndpoint(const RendezvousInfo& info,
                                                                 int round_end_fd) {
  const WorkerSpec& spec = o_.spec;
  std::string addr = !spec.master_addr.empty() ? spec.master_addr
                     : info.group_world_size == 1 ? std::string("127.0.0.1")
                                                  : info.master.addr;
  // The round's MASTER_PORT: on node 0 the agent serves torch's TCPStore there, fresh for
  // every round, before any worker starts (TORCHELASTIC_USE_AGENT_STORE=True: every rank is
  // a client, none races to start the server). The other nodes wait until it is published
  // for this round, so their workers never reach the previous round's server.
  const std::string key = rdzv_->MasterPortKey(info.round);
  // The previous round's store closes on every node that served one, whatever its place in
  // this round: a worker still blocked on it (a re-form that cannot complete) gets an error
  // and goes on to this round instead of waiting out its timeout.
  if (torch_store_) torch_store_->Stop();
  torch_store_.reset();
  if (info.group_rank == 0) {
    int port = spec.master_port;
    if (port == 0) {
      if (!reserved_port_.valid()) {
        // Held (bound, not listening) for the agent's lifetime: the kernel hands this port to
        // no other port-0 bind, so two jobs on one machine never share a MASTER_PORT, while
        // the store of each round (SO_REUSEADDR) can still listen on it.
        COHORT_ASSIGN_OR_RETURN(reserved_port_, net::ReservePort("0.0.0.0", 0));
        COHORT_ASSIGN_OR_RETURN(reserved_port_number_, reserved_port_.LocalPort());
      }
      port = reserved_port_number_;
    }
    // Listening on the address the workers are given (never every interface unless the
    // user's --master-addr is not one this host can bind), admitting this user's processes
    // of this host and the round's other nodes at the addresses they published.
    store::TorchStoreServerOptions so{
        .host = "127.0.0.1",
        .port = port,
        .initial_keys = {{std::string(kTorchStoreRoundKey), std::to_string(info.round)}}};
    if (info.group_world_size > 1 || !spec.master_addr.empty()) {
      so.host = net::ResolveIpv4(addr).value_or("0.0.0.0");
      so.any_remote_host = settings::kTorchStoreAnyHost.Get();
      if (!so.any_remote_host && info.group_world_size > 1) {
        // Bounded by the join timeout, as slot 1's read of the same records (a large round
        // on a loaded etcd takes more than one call's 30 s).
        COHORT_ASSIGN_OR_RETURN(auto nodes,
                                rdzv_->RoundNodes(info, Deadline::After(o_.rdzv.join_timeout)));
        for (const auto& n : nodes) {
          so.remote_hosts.push_back(net::ResolveIpv4(n.addr).value_or(n.addr));
        }
      }
    }
    auto server = store::TorchStoreServer::Start(so);
    if (!server.ok() && so.host != "0.0.0.0") {
      // The address is not one of this host's (a name for a load balancer, a NAT): every
      // interface, with the same admission.
      COHORT_LOG_WARN(kLog, "cannot listen on MASTER_ADDR {} ({}); the workers' torch store "
                      "listens on every interface", so.host, server.status().message());
      so.host = "0.0.0.0";
      server = store::TorchStoreServer::Start(so);
    }
    if (!server.ok()) {
      return Status(server.status().code(),
                    fmt::format("cannot serve the workers' torch store on MASTER_PORT {}: {}",
                                port, server.status().message()));
    }
    torch_store_ = std::move(*server);
    if (info.group_world_size > 1) {
      COHORT_RETURN_IF_ERROR(store_->Set(key, std::to_string(port), Deadline::AfterMs(30000)));
    }
    return std::make_pair(addr, port);
  }
  // Node 0 may be lost before it publishes the port: then this round ends (the watcher says
  // so) and the next one forms, so the wait lasts only as long as the round.
  const Deadline deadline = Deadline::After(o_.rdzv.join_timeout);
  for (;;) {
    const Deadline slice =
        Deadline::At(std::min(deadline.time(), SteadyClock::now() + std::chrono::milliseconds(500)));
    Result<std::string> port = store_->Get(key, slice);
    if (port.ok()) return std::make_pair(addr, static_cast<int>(ParseInt64(*port).value_or(0)));
    if (port.status().code() != StatusCode::kDeadlineExceeded || deadline.expired()) {
      return port.status();
    }
    pollfd ended{round_end_fd, POLLIN, 0};
    if (::poll(&ended, 1, 0) > 0) {
      return Aborted("round {} ended before its node 0 published MASTER_PORT", info.round);
    }
  }
}

Status Agent::Impl::StartWorkers(const RendezvousInfo& info, int round_end_fd) {
  const WorkerSpec& spec = o_.spec;
  COHORT_ASSIGN_OR_RETURN(auto master, MasterEndpoint(info, round_end_fd));
  const int world = info.WorldSize();
  const int offset = info.RankOffset();
  const int attempt = starts_++;
  attempt_dir_ = fmt::format("{}/{}/attempt_{}", spec.log_dir, spec.run_id, attempt);
  if (LiveOffered()) OpenChannel();
  failure_.reset();
  workers_.clear();
  workers_.reserve(spec.nproc_per_node);
  // One console merger per stream, sized by the ranks that print to it.
  int shown_out = 0, shown_err = 0;
  for (int local = 0; local < spec.nproc_per_node; ++local) {
    if (!spec.local_ranks_filter.empty() && !spec.local_ranks_filter.count(local)) continue;
    shown_out += !(spec.redirects.For(local) & 1) || (spec.tee.For(local) & 1);
    shown_err += !(spec.redirects.For(local) & 2) || (spec.tee.For(local) & 2);
  }
  if (out_console_) out_console_->FlushAll();
  if (err_console_) err_console_->FlushAll();
  out_console_ = std::make_unique<ConsoleMerger>(STDOUT_FILENO, shown_out, spec.log_merge_window);
  err_console_ = std::make_unique<ConsoleMerger>(STDERR_FILENO, shown_err, spec.log_merge_window);
  std::function<void(int, std::string_view)> on_line;
  if (o_.events) {
    on_line = [this](int rank, std::string_view line) {
      AddEvent({{"type", "log"}, {"rank", rank}, {"line", std::string(line)}});
    };
  }
  for (int local = 0; local < spec.nproc_per_node; ++local) {
    Worker w;
    w.local_rank = local;
    w.rank = offset + local;
    std::string dir = fmt::format("{}/{}", attempt_dir_, w.rank);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return Internal("cannot create log directory {}: {}", dir, ec.message());
    w.error_file = dir + "/error.json";
    fs::remove(w.error_file, ec);
    WorkerEnv we;
    we.rank = w.rank;
    we.local_rank = local;
    we.world_size = world;
    we.local_world_size = spec.nproc_per_node;
    we.group_rank = info.group_rank;
    we.group_world_size = info.group_world_size;
    we.role_rank = w.rank;
    we.role_world_size = world;
    we.role_name = spec.role;
    we.master_addr = master.first;
    we.master_port = master.second;
    we.agent_store = true;
    we.restart_count = info.restart_count;
    we.max_restarts = spec.max_restarts;
    we.run_id = spec.run_id;
    we.error_file = w.error_file;
    we.omp_num_threads = OmpThreadsForWorkers();
    we.store = spec.store_access;
    we.store.round_prefix = info.store_prefix;
    we.attempt = attempt;
    we.round = static_cast<int>(info.round);
    we.job_cookie = sweeper_ ? sweeper_->cookie() : "";
    we.listen_addr = spec.listen_addr;
    we.flight_recorder_dir = FlightRecordDir(w.rank);
    we.metrics_dir = o_.metrics_dir;
    we.membership_dir = membership_dir_;
    we.snapshot_dir = snapshot_dir_;
    we.membership_secret = membership_dir_.empty() ? "" : membership_secret_;
    SpawnOptions so;
    so.argv = spec.argv;
    so.env = WorkerEnvironment(we, spec.extra_env);
    auto child = SpawnWorker(so);
    if (!child.ok()) return child.status();
    w.child = *child;
    w.alive = true;
    const bool shown = spec.local_ranks_filter.empty() || spec.local_ranks_filter.count(local);
    const int redirect = spec.redirects.For(local), tee = spec.tee.For(local);
    auto console = [&](int bit, ConsoleMerger* merger) {
      bool to_console = shown && (!(redirect & bit) || (tee & bit));
      return to_console ? merger : nullptr;
    };
    w.out = std::make_unique<LogSink>(w.rank, console(1, out_console_.get()),
                                      dir + "/stdout.log", on_line);
    w.err = std::make_unique<LogSink>(w.rank, console(2, err_console_.get()),
                                      dir + "/stderr.log", on_line);
    workers_.push_back(std::move(w));
  }
  state_ = WorkerState::kHealthy;
  for (const auto& w : workers_) PublishWorker(w);
  PublishStatus();
  COHORT_LOG_DEBUG(kLog, "attempt {}: started {} worker(s), ranks {}..{} of {}", attempt,
                   spec.nproc_per_node, offset, offset + spec.nproc_per_node - 1, world);
  return Status::Ok();
}

void Agent::Impl::OpenChannel() {
  // A private directory (mkdtemp: mode 0700, a name nobody can predict or prepare) in the
  // agent's private runtime directory, one per worker group; removed with the group
  // (StopWorkers), and with the runtime directory should the agent be killed.
  auto dir = runtime_dir_.empty()
                 ? Result<std::string>(FailedPrecondition("no private runtime directory"))
                 : MakePrivateDir(runtime_dir_, "membership-");
  auto watch = dir.ok() ? membership_channel::ChannelWatch::Open(*dir)
                        : Result<std::unique_ptr<membership_channel::ChannelWatch>>(dir.status());
  if (dir.ok()) membership_dir_ = *dir;
  if (!watch.ok()) {
    if (dir.ok()) {
      std::error_code ec;
      fs::remove_all(*dir, ec);
    }
    COHORT_LOG_WARN(kLog, "no membership channel ({}): workers will be restarted on a "
                    "membership change", watch.status().message());
    membership_dir_.clear();
    return;
  }
  channel_ = std::move(*watch);
}

int Agent::Impl::OmpThreadsForWorkers() const {
  // As torchrun: one intra-op thread per worker when several share the node, unless the
  // user chose a number.
  return !worker_env::Inherited(worker_env::kOmpNumThreads) && o_.spec.nproc_per_node > 1;
}

void Agent::Impl::StartZygote() {
  const WorkerSpec& spec = o_.spec;
  if (spec.warm.program_at == 0) return;
  const auto script = spec.argv.begin() + static_cast<ptrdiff_t>(spec.warm.program_at);
  WorkerEnv we;  // what every worker of the node shares; ranks are set per worker
  we.omp_num_threads = OmpThreadsForWorkers();
  auto z = Zygote::Start({.python = spec.argv[0],
                          // the interpreter's options, without the "-m" of a module
                          .flags = {spec.argv.begin() + 1, script - (spec.warm.module ? 1 : 0)},
                          .preload = spec.warm.preload,
                          .zygote_script = spec.warm.zygote_script,
                          .env = WorkerEnvironment(we, spec.extra_env)});
  if (!z.ok()) {
    COHORT_LOG_WARN(kLog, "cannot start the warm interpreter ({}); workers start fresh",
                    z.status().message());
    return;
  }
  zygote_ = std::move(*z);
  subreaper_ = true;
}

Result<Child> Agent::Impl::SpawnWorker(const SpawnOptions& so) {
  if (zygote_) {
    const WorkerSpec::WarmStart& warm = o_.spec.warm;
    std::vector<std::string> program(so.argv.begin() + static_cast<ptrdiff_t>(warm.program_at),
                                     so.argv.end());
    // The import of torch takes seconds on a busy machine; a fork takes milliseconds.
    auto child = zygote_->SpawnWorker(program, so.argv, warm.module, so.env, so.working_dir,
                                      Deadline::AfterMs(120000));
    if (child.ok()) return child;
    COHORT_LOG_WARN(kLog, "the warm interpreter cannot start workers ({}); they start fresh",
                    child.status().message());
    zygote_.reset();
  }
  return Spawn(so);
}

void Agent::Impl::CloseWorkerPipes(Worker& w) {
  for (auto [fd, sink] : {std::pair{&w.child.out_fd, w.out.get()},
                          std::pair{&w.child.err_fd, w.err.get()}}) {
    if (*fd >= 0) {
      sink->Drain(*fd);
      ::close(*fd);
      *fd = -1;
    }
    if (sink) sink->Finish();
  }
}

void Agent::Impl::OnWorkerExit(Worker& w) {
  w.status = Reap(w.child.pid);
  if (subreaper_) {
    // A subreaper adopts the orphans of its descendants: reap those that exited.
    std::vector<pid_t> known;
    if (zygote_) known.push_back(zygote_->pid());
    for (const auto& other : workers_) {
      if (other.alive && &other != &w) known.push_back(other.child.pid);
    }
    ReapAdoptedOrphans(known);
  }
  w.alive = false;
  PublishWorker(w);
  PublishStatus();
  ::close(w.child.pidfd);
  w.child.pidfd = -1;
  // Whatever the worker wrote before exiting is in its pipes now; a grandchild that keeps
  // the pipe open must not delay us, so read what is there and close.
  CloseWorkerPipes(w);
  if (!w.status.success() && !failure_) {
    FailureRecord f;
    f.rank = w.rank;
    f.host = o_.self.host;
    f.exit_code = w.status.exited ? w.status.code : 0;
    f.signal = w.status.exited ? 0 : w.status.signal;
    f.message = ReadErrorFile(w.error_file);
    if (f.message.empty()) f.message = w.err->LastLine();
    failure_ = f;
  }
}

int Agent::Impl::MonitorTimeoutMs() const {
  int timeout = -1;
  auto sooner = [&](int t) {
    if (t >= 0 && (timeout < 0 || t < timeout)) timeout = t;
  };
  for (ConsoleMerger* m : {out_console_.get(), err_console_.get()}) {
    if (m) sooner(m->PollTimeoutMs());
  }
  if (reform_deadline_) sooner(reform_deadline_->PollTimeoutMs());
  return timeout;
}

void Agent::Impl::ForwardSignal(int sig) {
  for (auto& w : workers_) {
    if (w.alive) SignalGroup(w.child.pid, sig);
  }
}

Agent::Impl::Outcome Agent::Impl::Monitor(int watch_fd) {
  std::vector<pollfd> fds;
  // What each pollfd stands for: -1 signal, -2 watcher, else worker index * 3 + kind.
  std::vector<int> owners;
  for (;;) {
    fds.clear();
    owners.clear();
    fds.push_back({signal_fd_, POLLIN, 0});
    owners.push_back(-1);
    if (watch_fd >= 0) {
      fds.push_back({watch_fd, POLLIN, 0});
      owners.push_back(-2);
    }
    if (channel_) {
      fds.push_back({channel_->fd(), POLLIN, 0});
      owners.push_back(-3);
    }
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Worker& w = workers_[i];
      if (w.alive) {
        fds.push_back({w.child.pidfd, POLLIN, 0});
        owners.push_back(static_cast<int>(i) * 3);
      }
      if (w.child.out_fd >= 0) {
        fds.push_back({w.child.out_fd, POLLIN, 0});
        owners.push_back(static_cast<int>(i) * 3 + 1);
      }
      if (w.child.err_fd >= 0) {
        fds.push_back({w.child.err_fd, POLLIN, 0});
        owners.push_back(static_cast<int>(i) * 3 + 2);
      }
    }
    if (reform_deadline_ && reform_deadline_->expired()) return Outcome::kReformTimedOut;
    int rc = ::poll(fds.data(), fds.size(), MonitorTimeoutMs());
    if (rc < 0) {
      if (errno == EINTR) continue;
      COHORT_LOG_ERROR(kLog, "poll failed: {}", std::strerror(errno));
      return Outcome::kSignaled;
    }
    if (out_console_) out_console_->FlushDue();
    if (err_console_) err_console_->FlushDue();
    bool exited = false;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      int owner = owners[k];
      if (owner == -1) {
        signalfd_siginfo si{};
        while (::read(signal_fd_, &si, sizeof(si)) == sizeof(si)) {
          int sig = static_cast<int>(si.ssi_signo);
          COHORT_LOG_INFO(kLog, "received {}; forwarding to the workers", strsignal(sig));
          ForwardSignal(sig);
          if (IsTermination(sig)) terminating_signal_ = sig;
        }
        if (terminating_signal_) return Outcome::kSignaled;
        continue;
      }
      if (owner == -2) return Outcome::kRoundEnded;
      if (owner == -3) {
        if (auto outcome = ReadChannel()) return *outcome;
        continue;
      }
      Worker& w = workers_[owner / 3];
      switch (owner % 3) {
        case 0:
          OnWorkerExit(w);
          exited = true;
          break;
        case 1:
          if (w.child.out_fd >= 0 && !w.out->Drain(w.child.out_fd)) {
            ::close(w.child.out_fd);
            w.child.out_fd = -1;
          }
          break;
        case 2:
          if (w.child.err_fd >= 0 && !w.err->Drain(w.child.err_fd)) {
            ::close(w.child.err_fd);
            w.child.err_fd = -1;
          }
          break;
      }
    }
    if (!exited) continue;
    if (failure_) {
      state_ = WorkerState::kFailed;
      return Outcome::kFailed;
    }
    bool all_done = true;
    for (const auto& w : workers_) all_done = all_done && !w.alive;
    if (all_done) {
      state_ = WorkerState::kSucceeded;
      return Outcome::kSucceeded;
    }
  }
}

// Stops the group: `first_signal` to every live worker's process group, the grace period
// (draining pipes so no worker blocks on a full pipe), then SIGKILL. Finally SIGKILL each
// worker's process group again so no descendant outlives the attempt.
void Agent::Impl::StopWorkers(int first_signal) {
  if (workers_.empty() && !channel_) return;
  for (auto& w : workers_) {
    if (w.alive) SignalGroup(w.child.pid, first_signal);
  }
  Deadline grace = Deadline::After(o_.spec.stop_grace);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<size_t> idx;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].alive) {
        fds.push_back({workers_[i].child.pidfd, POLLIN, 0});
        idx.push_back(i);
      }
    }
    if (fds.empty() || grace.expired()) break;
    int rc = ::poll(fds.data(), fds.size(), grace.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents) OnWorkerExit(workers_[idx[k]]);
    }
    for (auto& w : workers_) {
      if (w.child.out_fd >= 0) w.out->Drain(w.child.out_fd);
      if (w.child.err_fd >= 0) w.err->Drain(w.child.err_fd);
    }
  }
  for (auto& w : workers_) {
    if (w.alive) {
      COHORT_LOG_WARN(kLog, "rank {} did not stop within the grace period; killing it", w.rank);
      SignalGroup(w.child.pid, SIGKILL);
      OnWorkerExit(w);
    }
    SignalGroup(w.child.pid, SIGKILL);
    CloseWorkerPipes(w);
  }
  // Descendants that left their worker's process group (setsid) carry the job's cookie.
  if (sweeper_) {
    if (int n = sweeper_->SweepNow(); n > 0) {
      COHORT_LOG_INFO(kLog, "killed {} process(es) the workers left outside their groups", n);
    }
    // Segments of a group whose creator died before every member mapped them.
    if (int n = sweeper_->RemoveSegments(); n > 0) {
      COHORT_LOG_INFO(kLog, "removed {} shared-memory segment(s) the workers left", n);
    }
  }
  if (out_console_) out_console_->FlushAll();
  if (err_console_) err_console_->FlushAll();
  if (state_ == WorkerState::kHealthy || state_ == WorkerState::kUnhealthy) {
    state_ = WorkerState::kStopped;
  }
  PublishStatus();  // the ranks' last states stay visible until the next attempt
  workers_.clear();
  state_ = WorkerState::kStopped;
  channel_.reset();
  if (!membership_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(membership_dir_, ec);
  }
  membership_dir_.clear();
  reform_deadline_.reset();
}

void Agent::Impl::PublishWorker(const Worker& w) {
  metrics::DefaultRegistry()
      .GetGauge("cohort_agent_worker_up", "1 while the worker process of this rank runs",
                {{"rank", std::to_string(w.rank)}})
      .Set(w.alive ? 1 : 0);
}

void Agent::Impl::PublishStatus() {
  int running = 0;
  for (const auto& w : workers_) running += w.alive;
  metrics::DefaultRegistry()
      .GetGauge("cohort_agent_workers_running", "Worker processes alive on this node")
      .Set(running);
  if (!o_.status) return;  // the per-rank table only for a dashboard (O(workers) each time)
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& w : workers_) {
    ranks.push_back({{"rank", w.rank},
                     {"local_rank", w.local_rank},
                     {"pid", w.child.pid},
                     {"state", w.alive ? std::string("HEALTHY")
                                       : w.status.success() ? std::string("SUCCEEDED")
                                                            : "FAILED (" + w.status.Describe() + ")"}});
  }
  nlohmann::json s = {{"run_id", o_.spec.run_id},
                      {"host", o_.self.host},
                      {"pid", ::getpid()},
                      {"state", std::string(WorkerStateName(state_))},
                      {"round", last_round_},
                      {"max_restarts", o_.spec.max_restarts},
                      {"nproc_per_node", o_.spec.nproc_per_node},
                      {"ranks", ranks}};
  if (info_) {
    s["world_size"] = info_->WorldSize();
    s["group_rank"] = info_->group_rank;
    s["group_world_size"] = info_->group_world_size;
    // What a user reads as restarts is what happened to this node's workers: restarted
    // (new processes) or re-formed live (the same processes); the job-wide budget spent
    // (failures and lost nodes, re-forms included) is shown beside max_restarts.
    s["restarts"] = std::max(0, starts_ - 1);  // worker groups started after the first
    s["reforms"] = live_reforms_;
    s["budget_used"] = info_->restart_count;
  }
  o_.status->Set(std::move(s));
}

std::string Agent::Impl::CollectFlightRecords(const FailureRecord& failure) {
  auto dump_path = [&](const Worker& w) { return FlightRecordPath(FlightRecordDir(w.rank), w.rank); };
  const Worker* failed = nullptr;
  for (const auto& w : workers_) {
    if (w.rank == failure.rank) failed = &w;
  }
  // Only libcohort workers dump (and handle SIGUSR1); the failed rank's own timeout dump
  // tells us this is one.
  if (failed == nullptr || !fs::exists(dump_path(*failed))) return "";
  int in = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  int waiting = 0;
  for (auto& w : workers_) {
    if (!w.alive) continue;
    if (in >= 0) {
      ::inotify_add_watch(in, FlightRecordDir(w.rank).c_str(), IN_CLOSE_WRITE);
    }
    SignalGroup(w.child.pid, SIGUSR1);
    ++waiting;
  }
  // Bounded wait for the dumps: one close-after-write event per signalled worker.
  const Deadline deadline = Deadline::AfterMs(1000);
  while (in >= 0 && waiting > 0 && !deadline.expired()) {
    pollfd p{in, POLLIN, 0};
    if (::poll(&p, 1, deadline.PollTimeoutMs()) <= 0) break;
    alignas(inotify_event) char buf[4096];
    ssize_t n = ::read(in, buf, sizeof(buf));
    for (ssize_t off = 0; n > 0 && off < n;) {
      auto* ev = reinterpret_cast<inotify_event*>(buf + off);
      if (ev->mask & IN_CLOSE_WRITE) --waiting;
      off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
    }
  }
  if (in >= 0) ::close(in);
  std::string report;
  std::vector<std::pair<int, long>> last_seq;  // (rank, sequence of its last operation)
  long newest = -1;
  std::string newest_op;
  for (const auto& w : workers_) {
    auto text = ReadFileToString(dump_path(w));
    std::optional<FlightRecordEntry> e =
        text.ok() ? LastFlightRecordEntry(*text) : std::nullopt;
    if (!e) continue;
    report += fmt::format("\n  rank {}: last operation {} #{} ({} x {}) {}", w.rank, e->op, e->seq,
                          e->count, e->dtype, e->state);
    const long n = static_cast<long>(e->seq);
    last_seq.emplace_back(w.rank, n);
    if (n > newest) {
      newest = n;
      newest_op = e->op;
    }
  }
  if (report.empty()) return "";
  for (const auto& [rank, n] : last_seq) {
    if (n < newest) {
      report += fmt::format("\n  => rank {} has not entered {} #{}", rank, newest_op, newest);
    }
  }
  return "collective state at the failure (flight recorders; a rank whose last operation is "
         "older than the others' did not enter the next one):" + report;
}

AgentResult Agent::Impl::FailureResult(const std::string& why) {
  std::string text = fmt::format("cohort: job '{}' failed: {}", o_.spec.run_id, why);
  if (last_round_ >= 0) {
    auto f = rdzv_->GetFailure(last_round_);
    if (f.ok()) text += fmt::format("\ncohort: first failure: {}", f->Describe());
  }
  if (!stall_report_.empty()) text += "\ncohort: " + stall_report_;
  if (!o_.spec.entrypoint_note.empty()) text += "\ncohort: " + o_.spec.entrypoint_note;
  text += fmt::format("\ncohort: logs: {}/{}", o_.spec.log_dir, o_.spec.run_id);
  return {kExitWorkerFailed, text};
}

// The round's watcher thread: heartbeats and round-end notices, on a store connection of
// its own; fd() becomes readable when the round ended elsewhere or the store was lost.
// Started only when other nodes may exist. The destructor stops and joins the thread.
class RoundWatcher {
 public:
  RoundWatcher(const AgentOptions& o, const RendezvousInfo& info) {
    if (o.rdzv.max_nodes <= 1) return;
    auto ws = o.connect_store();
    if (!ws.ok()) {
      COHORT_LOG_WARN(kLog, "no watcher connection: {}", ws.status().message());
      return;
    }
    store_ = *ws;
    thread_ = std::thread([this, &o, info] {
      pthread_setname_np(pthread_self(), "rdzv-watch");
      Rendezvous watch(store_, o.rdzv, o.self);
      while (!stop_) {
        auto ended = watch.WatchStep(info, beating_.load());
        if (stop_) return;
        if (!ended.ok()) {
          COHORT_LOG_WARN(kLog, "lost the rendezvous store: {}", ended.status().message());
          ended_.Notify();
          return;
        }
        if (ended->has_value()) {
          COHORT_LOG_INFO(kLog, "round {} ended: {}", info.round, (*ended)->Describe());
          {
            MutexLock lock(&mu_);
            why_ = **ended;
          }
          ended_.Notify();
          return;
        }
      }
    });
  }
  ~RoundWatcher() {
    if (!thread_.joinable()) return;
    stop_ = true;
    store_->Abort();
    thread_.join();
  }
  RoundWatcher(const RoundWatcher&) = delete;
  RoundWatcher& operator=(const RoundWatcher&) = delete;

  // No more beats from the next step on (the node is about to write "finished" into its
  // counter, which a beat could no longer add to); it keeps watching.
  void StopBeating() { beating_ = false; }
  // The notice's fd, or -1 when nothing watches.
  int fd() const { return thread_.joinable() ? ended_.fd() : -1; }
  // Why the round ended, once fd() fired (nullopt: the store was lost).
  std::optional<RoundEnd> why() const {
    MutexLock lock(&mu_);
    return why_;
  }

 private:
  mutable Mutex mu_;
  std::optional<RoundEnd> why_ COHORT_GUARDED_BY(mu_);
  EventFd ended_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> beating_{true};
  std::shared_ptr<store::Store> store_;
  std::thread thread_;
};

std::optional<AgentResult> Agent::Impl::Setup() {
  sigset_t set = AgentSignals();
  signal_fd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) return AgentResult{kExitInternal, "cohort: signalfd failed"};
  auto store = o_.connect_store();
  if (!store.ok()) {
    return AgentResult{kExitRendezvous, fmt::format("cohort: cannot reach the rendezvous store: {}",
                                                    store.status().message())};
  }
  store_ = *store;
  rdzv_ = std::make_unique<Rendezvous>(store_, o_.rdzv, o_.self);
  // This agent's private runtime directory (membership channels, when it may offer them):
  // removed by the sweeper's helper when the agent ends, however it ends.
  if (LiveOffered()) {
    auto dir = MakePrivateDir("", "cohort-agent-");
    if (dir.ok()) {
      runtime_dir_ = *dir;
    } else {
      COHORT_LOG_WARN(kLog, "no private runtime directory ({}): workers will be restarted on "
                      "a membership change", dir.status().message());
    }
  }
  sweeper_ = std::make_unique<JobSweeper>(runtime_dir_);
  MakeSnapshotDir();
  StartZygote();  // imports torch while the rendezvous runs
  return std::nullopt;
}

void Agent::Impl::MakeSnapshotDir() {
  if (!sweeper_) return;
  const std::string dir = "/dev/shm/cohort-" + sweeper_->cookie() + "-snapshots";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    COHORT_LOG_WARN(kLog, "no snapshot directory in shared memory ({}: {}): workers' in-memory "
                    "checkpoints will not outlive them", dir, std::strerror(errno));
    return;
  }
  snapshot_dir_ = dir;
}

void Agent::Impl::RecordRound(const RendezvousInfo& info, bool first, bool live) {
  last_round_ = info.round;
  info_ = info;
  auto& reg = metrics::DefaultRegistry();
  reg.GetCounter("cohort_agent_rendezvous_rounds_total", "Rendezvous rounds this agent joined")
      .Add();
  reg.GetGauge("cohort_agent_round", "Current rendezvous round").Set(double(info.round));
  reg.GetGauge("cohort_agent_world_size", "Workers in the job (all nodes)").Set(info.WorldSize());
  reg.GetGauge("cohort_agent_restarts", "Failures counted against the job's restart budget")
      .Set(double(info.restart_count));
  AddEvent({{"type", "round"},
            {"round", info.round},
            {"cause", first  ? std::string("start")
                      : live ? fmt::format("world size {}, workers kept (live reconfiguration)",
                                           info.WorldSize())
                             : fmt::format("world size {}, restart {} of {}", info.WorldSize(),
                                           info.restart_count, o_.spec.max_restarts)}});
  if (live) {
    reg.GetCounter("cohort_agent_live_reconfigurations_total",
                   "Rounds this node's workers joined without a restart")
        .Add();
    COHORT_LOG_INFO(kLog, "round {}: keeping the workers, world size {} (live reconfiguration)",
                    info.round, info.WorldSize());
  } else if (!first) {
    COHORT_LOG_INFO(kLog, "round {}: restarting the workers (restart {} of {}), world size {}",
                    info.round, info.restart_count, o_.spec.max_restarts, info.WorldSize());
  }
}

// After MarkFinished: the node serving the store keeps it until the other nodes finish.
AgentResult Agent::Impl::Succeeded(const RendezvousInfo& info) {
  if (!o_.serves_store || info.group_world_size <= 1) return {kExitOk, ""};
  // Other nodes still need the store: serve it until the job is over.
  COHORT_LOG_INFO(kLog, "workers done; serving the store until the other nodes finish");
  auto outcome = Guarded([&] { return rdzv_->WaitForJobEnd(info); });
  if (int sig = terminating_signal_.load()) {
    return {ExitCodeForSignal(sig), fmt::format("cohort: stopped by {}", strsignal(sig))};
  }
  if (!outcome.ok()) {
    COHORT_LOG_WARN(kLog, "stopped waiting for the other nodes: {}", outcome.status().message());
  } else if (*outcome != "succeeded") {
    COHORT_LOG_WARN(kLog, "the job ended on another node: {}", *outcome);
  }
  return {kExitOk, ""};
}

std::optional<AgentResult> Agent::Impl::Failed(const RendezvousInfo& info) {
  FailureRecord f = *failure_;
  COHORT_LOG_WARN(kLog, "{}; stopping the worker group", f.Describe());
  metrics::DefaultRegistry()
      .GetCounter("cohort_agent_worker_failures_total", "Worker failures seen on this node")
      .Add();
  AddEvent({{"type", "failure"}, {"round", info.round}, {"cause", f.Describe()}});
  stall_report_ = CollectFlightRecords(f);
  if (!stall_report_.empty()) COHORT_LOG_WARN(kLog, "{}", stall_report_);
  StopWorkers(SIGTERM);
  // Every node comes back after a failure: the next round closes once they all joined.
  auto ended = rdzv_->EndRound(
      info.round, RoundEnd{RoundEnd::Kind::kFailure, fmt::format("rank {}", f.rank)}, &f,
      info.group_world_size);
  if (!ended.ok()) {
    return AgentResult{kExitRendezvous,
                       fmt::format("cohort: {}; and the store is unreachable: {}", f.Describe(),
                                   ended.status().message())};
  }
  return std::nullopt;  // next round
}

bool Agent::Impl::KeepWorkers(const RoundEnd& why, const RendezvousInfo& info) {
  if (membership_dir_.empty() || workers_.empty()) return false;
  if (why.kind != RoundEnd::Kind::kJoin && why.kind != RoundEnd::Kind::kDeadNode) return false;
  // Fewer than MIN nodes left: the job waits for nodes, without workers (as torchrun).
  if (why.kind == RoundEnd::Kind::kDeadNode && info.group_world_size - 1 < o_.rdzv.min_nodes) {
    return false;
  }
  for (const auto& w : workers_) {
    if (!w.alive || !membership_channel::IsReady(membership_dir_, w.local_rank)) return false;
  }
  return true;
}

bool Agent::Impl::Announce(const RendezvousInfo& info, int round_end_fd) {
  // A worker that exited while the round formed is noticed now, before anything is sent.
  for (auto& w : workers_) {
    pollfd p{w.child.pidfd, POLLIN, 0};
    if (w.alive && ::poll(&p, 1, 0) > 0) OnWorkerExit(w);
  }
  bool all_alive = true;
  for (const auto& w : workers_) all_alive = all_alive && w.alive;
  // Node 0 serves the round's torch store; the others learn its port (newcomers need it).
  auto master = all_alive ? MasterEndpoint(info, round_end_fd)
                          : Result<std::pair<std::string, int>>(Cancelled("a worker exited"));
  Status sent = master.status();
  const int offset = info.RankOffset();
  for (auto& w : workers_) {
    if (!sent.ok()) break;
    // What the worker wrote so far carries its old rank; later lines its new one.
    if (w.child.out_fd >= 0) w.out->Drain(w.child.out_fd);
    if (w.child.err_fd >= 0) w.err->Drain(w.child.err_fd);
    w.rank = offset + w.local_rank;
    w.out->SetRank(w.rank);
    w.err->SetRank(w.rank);
    sent = membership_channel::WriteNotice(
        membership_dir_, w.local_rank,
        MembershipNotice{.round = info.round,
                         .rank = w.rank,
                         .world_size = info.WorldSize(),
                         .group_rank = info.group_rank,
                         .group_world_size = info.group_world_size,
                         .store_prefix = info.store_prefix,
                         .restart_count = info.restart_count,
                         .master_addr = master->first,
                         .master_port = master->second},
        membership_secret_);
  }
  if (!sent.ok() && sent.code() == StatusCode::kAborted && !master.ok()) {
    // The round ended before it could be announced (its node 0 was lost): the workers wait
    // for the next round's notice; Monitor sees the round's end at once.
    COHORT_LOG_INFO(kLog, "round {}: {}; the workers wait for the next round", info.round,
                    sent.message());
    return true;
  }
  if (!sent.ok()) {
    COHORT_LOG_WARN(kLog, "round {}: cannot keep the workers ({}); restarting them", info.round,
                    sent.message());
    failure_.reset();
    StopWorkers(SIGTERM);
    return false;
  }
  reform_started_ = SteadyClock::now();
  reform_deadline_ = Deadline::After(ReconfigTimeout());
  ++live_reforms_;  // counted once announced: a failed announcement restarts them instead
  state_ = WorkerState::kHealthy;
  for (const auto& w : workers_) PublishWorker(w);
  PublishStatus();
  return true;
}

std::optional<Agent::Impl::Outcome> Agent::Impl::ReadChannel() {
  bool lost = false, formed = false;
  for (const auto& [file, local] : channel_->Changed()) {
    lost |= file == membership_channel::File::kLost;
    formed |= file == membership_channel::File::kFormed;
  }
  for (const auto& w : workers_) {
    if (!lost) break;
    auto report = membership_channel::ReadLost(membership_dir_, w.local_rank, membership_secret_);
    if (!report.ok() && report.status().code() != StatusCode::kNotFound) {
      COHORT_LOG_WARN(kLog, "local rank {}: {}", w.local_rank, report.status().message());
    }
    // Reports of an earlier round come from a worker that had not yet seen the new one.
    if (report.ok() && report->round == last_round_) {
      lost_ = *report;
      return Outcome::kPeerLost;
    }
  }
  if (formed && reform_deadline_) {
    bool all = true;
    for (const auto& w : workers_) {
      all = all && membership_channel::ReadFormed(membership_dir_, w.local_rank) == last_round_;
    }
    if (all) {
      const double ms = SecondsSince(reform_started_) * 1000;
      COHORT_LOG_INFO(kLog, "round {}: the workers re-formed in {:.0f} ms", last_round_, ms);
      AddEvent({{"type", "reconfigured"}, {"round", last_round_}, {"ms", ms}});
      reform_deadline_.reset();
    }
  }
  return std::nullopt;
}

std::optional<AgentResult> Agent::Impl::EndForLostPeer(const RendezvousInfo& info) {
  RoundEnd why{RoundEnd::Kind::kDeadNode,
               fmt::format("rank {} lost a peer: {}", lost_->rank, lost_->reason)};
  COHORT_LOG_WARN(kLog, "round {}: {}", info.round, why.detail);
  FailureRecord record;  // no rank failed: the record says who lost whom
  record.host = o_.self.host;
  record.message = why.detail;
  // Without the lost node, most likely: the next round closes once the others joined.
  auto ended = rdzv_->EndRound(info.round, why, &record, info.group_world_size - 1);
  if (!ended.ok()) {
    StopWorkers(SIGTERM);
    return AgentResult{kExitRendezvous, fmt::format("cohort: {}; and the store is unreachable: {}",
                                                    why.detail, ended.status().message())};
  }
  return std::nullopt;
}

// The job's directory of monitoring endpoints (job_directory.h): best effort, bounded; a
// store that does not answer costs the job nothing but its job-wide view.
void Agent::Impl::PublishEndpoint() {
  if (o_.metrics_url.empty() || directory_index_ > 0) return;
  nlohmann::json record = {{"url", o_.metrics_url}, {"host", o_.self.host},
                           {"addr", o_.self.addr}, {"pid", ::getpid()},
                           {"started", WallSeconds()}};
  auto index = agent::PublishEndpoint(*store_, o_.spec.run_id, record, Deadline::AfterMs(3000));
  if (index.ok()) {
    directory_index_ = *index;
  } else {
    COHORT_LOG_WARN(kLog, "could not publish the metrics endpoint in the job's store: {}",
                    index.status().message());
  }
}

void Agent::Impl::PublishEnd(const AgentResult& result) {
  if (directory_index_ <= 0 || !store_) return;
  const int code = result.exit_code;
  const std::string state = code == kExitOk ? "SUCCEEDED" : code > 128 ? "STOPPED" : "FAILED";
  nlohmann::json end = {{"state", state}, {"exit_code", code},
                        {"summary", result.summary.substr(0, 600)}, {"time", WallSeconds()}};
  Status s = agent::PublishEnd(*store_, o_.spec.run_id, directory_index_, end,
                               Deadline::AfterMs(2000));
  if (!s.ok()) COHORT_LOG_DEBUG(kLog, "could not record the end in the job's directory: {}", s.message());
}

AgentResult Agent::Impl::Run() {
  AgentResult result = RunRounds();
  PublishEnd(result);
  return result;
}

// A warm spare is warm before it waits: the interpreter has imported what the workers
// need, so that an admission costs a fork. Waits until the interpreter answers (bounded),
// or a termination signal ends the agent.
std::optional<AgentResult> Agent::Impl::WarmUpSpare() {
  const Deadline by = Deadline::After(std::chrono::minutes(10));
  if (const int fd = zygote_->ready_fd(); fd >= 0) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {signal_fd_, POLLIN, 0}};
    while (!fds[0].revents && !by.expired()) {
      if (::poll(fds, 2, by.PollTimeoutMs()) < 0 && errno != EINTR) break;
      signalfd_siginfo si{};
      if (fds[1].revents && ::read(signal_fd_, &si, sizeof(si)) == sizeof(si) &&
          IsTermination(static_cast<int>(si.ssi_signo))) {
        const int sig = static_cast<int>(si.ssi_signo);
        return AgentResult{ExitCodeForSignal(sig),
                           fmt::format("cohort: stopped by {} while warming up", strsignal(sig))};
      }
    }
  }
  const Status ready = zygote_->Ready(Deadline::AfterMs(1000));
  if (ready.ok()) {
    COHORT_LOG_INFO(kLog, "warm spare: the interpreter is ready; waiting for a place");
  } else {
    COHORT_LOG_WARN(kLog, "the warm interpreter cannot start workers ({}); they start fresh",
                    ready.message());
    zygote_.reset();
  }
  return std::nullopt;
}

AgentResult Agent::Impl::RunRounds() {
  if (auto early = Setup()) return *early;
  if (o_.rdzv.standby && zygote_) {
    if (auto stopped = WarmUpSpare()) return *stopped;
  }
  bool keep = false;  // the workers stay and are told the next round
  for (bool first = true;; first = false) {
    auto info = Guarded([&] { return rdzv_->Next(); });
    if (int sig = terminating_signal_.load()) {
      return {ExitCodeForSignal(sig), fmt::format("cohort: interrupted by {} during rendezvous",
                                     strsignal(sig))};
    }
    if (!info.ok()) {
      if (last_round_ >= 0 && info.status().code() == StatusCode::kFailedPrecondition) {
        AgentResult failed = FailureResult(info.status().message());
        (void)rdzv_->CloseJob("failed");  // wakes a store host waiting for the job to end
        return failed;
      }
      return {kExitRendezvous,
              fmt::format("cohort: rendezvous failed: {}", info.status().message())};
    }
    RecordRound(*info, first, keep);
    if (first) PublishEndpoint();
    // Heartbeats from now on: starting workers can take seconds (a warm interpreter that
    // is still importing torch), and the other nodes must not take this one for dead. The
    // watcher lives until this node's outcome is on the store: its connection carries the
    // node's will, and once it ends the peers may take the node for gone.
    std::optional<RoundWatcher> watcher;
    watcher.emplace(o_, *info);
    if (keep) keep = Announce(*info, watcher->fd());
    if (!keep) {
      if (Status started = StartWorkers(*info, watcher->fd()); !started.ok()) {
        StopWorkers(SIGKILL);
        if (started.code() == StatusCode::kAborted && watcher->why()) {
          COHORT_LOG_WARN(kLog, "{}; joining the next round", started.message());
          continue;  // the round ended while its workers were set up
        }
        int code = started.code() == StatusCode::kNotFound ? kExitNotFound : kExitInternal;
        return {code, fmt::format("cohort: cannot start the workers: {}", started.message())};
      }
    }
    keep = false;
    const Outcome outcome = Monitor(watcher->fd());
    const std::optional<RoundEnd> why = watcher->why();
    switch (outcome) {
      case Outcome::kSucceeded: {
        StopWorkers(SIGKILL);  // clears leftover descendants; workers are already gone
        watcher->StopBeating();
        Status s = rdzv_->MarkFinished(*info);
        if (!s.ok()) COHORT_LOG_WARN(kLog, "could not record success: {}", s.message());
        watcher.reset();
        return Succeeded(*info);
      }
      case Outcome::kSignaled: {
        int sig = terminating_signal_.load();
        StopWorkers(sig);
        // Best effort: tells spares and a waiting store host that the job is over.
        (void)rdzv_->CloseJob(fmt::format("interrupted by {}", strsignal(sig)));
        return {ExitCodeForSignal(sig), fmt::format("cohort: stopped by {}", strsignal(sig))};
      }
      case Outcome::kReformTimedOut:
        failure_ = FailureRecord{.rank = workers_.empty() ? -1 : workers_.front().rank,
                                 .host = o_.self.host,
                                 .message = fmt::format(
                                     "the workers did not re-form in round {} within {:.0f} s; "
                                     "restarting them",
                                     info->round, settings::kReconfigTimeout.Get())};
        [[fallthrough]];
      case Outcome::kFailed:
        if (auto result = Failed(*info)) return *result;
        break;
      case Outcome::kPeerLost:
        if (auto result = EndForLostPeer(*info)) return *result;
        keep = KeepWorkers(RoundEnd{RoundEnd::Kind::kDeadNode, ""}, *info);
        if (!keep) StopWorkers(SIGTERM);
        break;
      case Outcome::kRoundEnded:
        keep = why && KeepWorkers(*why, *info);
        AddEvent({{"type", keep ? "reconfigure" : "restart"}, {"round", info->round},
                  {"cause", why ? why->Describe() : std::string("the rendezvous store was lost")}});
        if (!keep) StopWorkers(SIGTERM);
        break;
    }
  }
}

}  // namespace cohort::agent
