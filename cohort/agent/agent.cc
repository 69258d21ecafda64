// Implements the elastic agent (see agent.h for the thread model): the rounds, each one
// joined, begun (workers started, or kept ones told the new round), watched and ended by one
// transition (AfterRound). The worker group (worker_group.h), live reconfiguration
// (live_reconfig.h) and the round watcher (round_watcher.h) live in files of their own.
// Only the monitor thread touches the group, the channel and the rendezvous object; the
// watcher and the signal guard share nothing with it but an eventfd, an atomic and a store
// connection of their own.
#include "cohort/agent/agent.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cohort/agent/job_directory.h"
#include "cohort/agent/live_reconfig.h"
#include "cohort/agent/round_watcher.h"
#include "cohort/agent/worker_group.h"
#include "cohort/base/event_fd.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/log.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/net/socket.h"
#include "cohort/store/torch_store_server.h"

namespace cohort::agent {

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

Duration ReconfigTimeout() {
  return std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(std::max(settings::kReconfigTimeout.Get(), 0.1)));
}

// How a round ended for this node, as the monitor loop saw it. kPeerLost: a local worker
// reported that a peer went away; kReformTimedOut: the workers did not re-form in the
// announced round by the deadline.
struct RoundOutcome {
  enum class Kind { kSucceeded, kFailed, kRoundEnded, kSignaled, kPeerLost, kReformTimedOut };
  Kind kind;
  std::optional<LostPeerReport> lost;  // kPeerLost: the report that ended the round
};

// What follows a round: the agent ends with `end`, or the next round begins with the
// workers kept (told their new place) or restarted.
struct NextStep {
  std::optional<AgentResult> end;
  bool keep_workers = false;
};

}  // namespace

void BlockAgentSignals() {
  sigset_t set = AgentSignals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

class Agent::Impl {
 public:
  explicit Impl(AgentOptions options)
      : o_(std::move(options)),
        live_(o_.rdzv.max_nodes > 1 && settings::kLiveReconfig.Get(), o_.rdzv.min_nodes,
              ReconfigTimeout()),
        group_(o_, [this] { PublishStatus(); }, LineEvents()) {}
  ~Impl() {
    StopWorkers(SIGKILL);
    if (signal_fd_ >= 0) ::close(signal_fd_);
  }

  // Runs the rounds, then records how this agent ended in the job's directory.
  AgentResult Run();

 private:
  // --- The rounds, in order -------------------------------------------------------------
  AgentResult RunRounds();
  // Opens the signal fd, the store, the runtime and snapshot directories and the zygote; a
  // result is the agent's answer (it could not start).
  std::optional<AgentResult> Setup();
  void MakeSnapshotDir();
  // A warm spare (--standby with a warm interpreter): waits (bounded) until the
  // interpreter is ready; a result only when a termination signal came meanwhile.
  std::optional<AgentResult> WarmUpSpare();
  // Remembers the round and publishes it (metrics, events, log). `first`: the job's first
  // round here; `live`: the workers stay and re-form in it.
  void RecordRound(const RendezvousInfo& info, bool first, bool live);
  // Starts the round's workers, or tells the kept ones their new place. A result ends the
  // agent; `retry` set: the round ended meanwhile, join the next one.
  std::optional<AgentResult> BeginRound(const RendezvousInfo& info, RoundWatcher& watcher,
                                        bool keep, bool* retry);
  RoundOutcome Monitor(int watch_fd);
  // The one transition at a round's end: what the agent does after `outcome`.
  NextStep AfterRound(const RendezvousInfo& info, const RoundOutcome& outcome,
                      std::optional<RoundWatcher>& watcher);
  // Every local worker succeeded: record it, then serve the store until the job ends when
  // this node hosts it.
  AgentResult Succeeded(const RendezvousInfo& info);
  // A local worker failed: report, stop the group, end the round. A result ends the agent;
  // none means the next round follows.
  std::optional<AgentResult> Failed(const RendezvousInfo& info);
  // Ends the round after a worker's lost-peer report (as a dead node: the others re-form
  // without it). A result ends the agent.
  std::optional<AgentResult> EndForLostPeer(const RendezvousInfo& info,
                                            const LostPeerReport& lost);
  AgentResult FailureResult(const std::string& why);

  // --- Workers --------------------------------------------------------------------------
  // `round_end_fd`: the round watcher's notice (readable once the round ended elsewhere):
  // the wait for node 0's MASTER_PORT lasts only as long as the round.
  Result<std::pair<std::string, int>> MasterEndpoint(const RendezvousInfo& info,
                                                     int round_end_fd);
  Result<std::pair<std::string, int>> ServeTorchStore(const RendezvousInfo& info,
                                                      const std::string& addr);
  Status StartWorkers(const RendezvousInfo& info, int round_end_fd);
  // Tells the kept workers the new round. False when they cannot be kept after all (one
  // exited, a notice failed): they are stopped and the caller starts the group afresh.
  bool Announce(const RendezvousInfo& info, int round_end_fd);
  void StopWorkers(int first_signal);
  // Reads the signal fd in the monitor loop: forwards each signal to the workers; true when
  // one of them terminates the agent.
  bool ForwardSignals();

  // Runs a blocking store call while a guard thread turns a terminating signal into an
  // abort of the store, so no rendezvous wait ever ignores Ctrl-C.
  template <typename Fn>
  auto Guarded(Fn fn) -> decltype(fn());

  // --- Monitoring (AgentOptions::status / events; the job's directory) --------------------
  void PublishStatus();
  void PublishEndpoint();
  void PublishEnd(const AgentResult& result);
  std::function<void(int, std::string_view)> LineEvents();
  void AddEvent(nlohmann::json event) {
    if (o_.events) o_.events->Add(std::move(event));
  }

  // --- Set once ---------------------------------------------------------------------------
  AgentOptions o_;
  int signal_fd_ = -1;
  std::shared_ptr<store::Store> store_;
  std::unique_ptr<Rendezvous> rdzv_;
  std::shared_ptr<rendezvous::RoundTell> tell_;  // told round ends (null: none)
  // The node's snapshot directory (COHORT_SNAPSHOT_DIR), in shared memory: named with the
  // job's cookie, so the sweeper's helper removes it when the agent ends, however it ends.
  std::string snapshot_dir_;
  int directory_index_ = 0;  // this agent's entry in the job's directory; 0: not published

  // --- Owned by the monitor thread, across rounds ------------------------------------------
  LiveReconfig live_;
  WorkerGroup group_;
  net::Socket reserved_port_;
  int reserved_port_number_ = 0;
  std::unique_ptr<store::TorchStoreServer> torch_store_;  // node 0: the round's MASTER_PORT
  int64_t last_round_ = -1;
  std::optional<RendezvousInfo> info_;  // the current round, for PublishStatus
  std::string stall_report_;            // flight records of the latest failure

  // --- Shared with the signal guard thread -----------------------------------------------
  std::atomic<int> terminating_signal_{0};
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
  // The previous round's store closes on every node that served one, whatever its place in
  // this round: a worker still blocked on it (a re-form that cannot complete) gets an error
  // and goes on to this round instead of waiting out its timeout.
  if (torch_store_) torch_store_->Stop();
  torch_store_.reset();
  if (info.group_rank == 0) return ServeTorchStore(info, addr);
  // The other nodes wait until node 0 published the port for this round, so their workers
  // never reach the previous round's server. Node 0 may be lost before it publishes it:
  // then this round ends (the watcher says so) and the next one forms, so the wait lasts
  // only as long as the round.
  const std::string key = rdzv_->MasterPortKey(info.round);
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

// The round's MASTER_PORT on node 0: the agent serves torch's TCPStore there, fresh for
// every round, before any worker starts (TORCHELASTIC_USE_AGENT_STORE=True: every rank is
// a client, none races to start the server), and publishes the port for the other nodes.
Result<std::pair<std::string, int>> Agent::Impl::ServeTorchStore(const RendezvousInfo& info,
                                                                  const std::string& addr) {
  const WorkerSpec& spec = o_.spec;
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
                  fmt::format("cannot serve the workers' torch store on MASTER_PORT {}: {}", port,
                              server.status().message()));
  }
  torch_store_ = std::move(*server);
  if (info.group_world_size > 1) {
    COHORT_RETURN_IF_ERROR(store_->Set(rdzv_->MasterPortKey(info.round), std::to_string(port),
                                       Deadline::AfterMs(30000)));
  }
  return std::make_pair(addr, port);
}

Status Agent::Impl::StartWorkers(const RendezvousInfo& info, int round_end_fd) {
  COHORT_ASSIGN_OR_RETURN(auto master, MasterEndpoint(info, round_end_fd));
  live_.OpenChannel();
  return group_.Start({.info = info,
                       .master = master,
                       .membership_dir = live_.dir(),
                       .membership_secret = live_.secret(),
                       .snapshot_dir = snapshot_dir_});
}

bool Agent::Impl::Announce(const RendezvousInfo& info, int round_end_fd) {
  // A worker that exited while the round formed is noticed now, before anything is sent.
  const bool all_alive = group_.ReapExited();
  // Node 0 serves the round's torch store; the others learn its port (newcomers need it).
  auto master = all_alive ? MasterEndpoint(info, round_end_fd)
                          : Result<std::pair<std::string, int>>(Cancelled("a worker exited"));
  if (!master.ok() && master.status().code() == StatusCode::kAborted) {
    // The round ended before it could be announced (its node 0 was lost): the workers wait
    // for the next round's notice; Monitor sees the round's end at once.
    COHORT_LOG_INFO(kLog, "round {}: {}; the workers wait for the next round", info.round,
                    master.status().message());
    return true;
  }
  const Status sent = master.ok() ? live_.Announce(info, *master, group_) : master.status();
  if (!sent.ok()) {
    COHORT_LOG_WARN(kLog, "round {}: cannot keep the workers ({}); restarting them", info.round,
                    sent.message());
    group_.ClearFailure();
    StopWorkers(SIGTERM);
    return false;
  }
  group_.Reformed();
  return true;
}

void Agent::Impl::StopWorkers(int first_signal) {
  group_.Stop(first_signal);
  live_.CloseChannel();
}

bool Agent::Impl::ForwardSignals() {
  signalfd_siginfo si{};
  while (::read(signal_fd_, &si, sizeof(si)) == sizeof(si)) {
    int sig = static_cast<int>(si.ssi_signo);
    COHORT_LOG_INFO(kLog, "received {}; forwarding to the workers", strsignal(sig));
    group_.ForwardSignal(sig);
    if (IsTermination(sig)) terminating_signal_ = sig;
  }
  return terminating_signal_ != 0;
}

RoundOutcome Agent::Impl::Monitor(int watch_fd) {
  using Kind = PollTag::Kind;
  using Outcome = RoundOutcome::Kind;
  for (;;) {
    PollSet set;
    set.Add(signal_fd_, {Kind::kSignal});
    if (watch_fd >= 0) set.Add(watch_fd, {Kind::kRoundEnded});
    if (live_.open()) set.Add(live_.fd(), {Kind::kChannel});
    group_.AddPollFds(set);
    if (live_.ReformTimedOut()) return {Outcome::kReformTimedOut, std::nullopt};
    int timeout = group_.ConsoleTimeoutMs();
    if (int t = live_.ReformTimeoutMs(); t >= 0 && (timeout < 0 || t < timeout)) timeout = t;
    if (::poll(set.fds.data(), set.fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      COHORT_LOG_ERROR(kLog, "poll failed: {}", std::strerror(errno));
      return {Outcome::kSignaled, std::nullopt};
    }
    group_.FlushDueConsoles();
    bool exited = false;
    for (size_t k = 0; k < set.fds.size(); ++k) {
      if (!set.fds[k].revents) continue;
      const PollTag& tag = set.tags[k];
      switch (tag.kind) {
        case Kind::kSignal:
          if (ForwardSignals()) return {Outcome::kSignaled, std::nullopt};
          break;
        case Kind::kRoundEnded:
          return {Outcome::kRoundEnded, std::nullopt};
        case Kind::kChannel:
          if (auto lost = live_.Read(last_round_, group_, [&](double ms) {
                COHORT_LOG_INFO(kLog, "round {}: the workers re-formed in {:.0f} ms",
                                last_round_, ms);
                AddEvent({{"type", "reconfigured"}, {"round", last_round_}, {"ms", ms}});
              })) {
            return {Outcome::kPeerLost, std::move(lost)};
          }
          break;
        default:
          exited |= group_.Handle(tag);
      }
    }
    if (!exited) continue;
    if (auto end = group_.CheckEnd()) {
      return {*end == WorkerGroup::End::kFailed ? Outcome::kFailed : Outcome::kSucceeded,
              std::nullopt};
    }
  }
}

std::function<void(int, std::string_view)> Agent::Impl::LineEvents() {
  if (!o_.events) return {};
  return [this](int rank, std::string_view line) {
    AddEvent({{"type", "log"}, {"rank", rank}, {"line", std::string(line)}});
  };
}

void Agent::Impl::PublishStatus() {
  int running = 0;
  for (const auto& w : group_.workers()) running += w.alive;
  metrics::DefaultRegistry()
      .GetGauge("cohort_agent_workers_running", "Worker processes alive on this node")
      .Set(running);
  if (!o_.status) return;  // the per-rank table only for a dashboard (O(workers) each time)
  metrics::AgentStatus s{.run_id = o_.spec.run_id,
                         .host = o_.self.host,
                         .pid = static_cast<int>(::getpid()),
                         .state = std::string(WorkerStateName(group_.state())),
                         .round = last_round_,
                         .max_restarts = o_.spec.max_restarts,
                         .nproc_per_node = o_.spec.nproc_per_node,
                         .ranks = {},
                         .joined = std::nullopt};
  for (const auto& w : group_.workers()) {
    s.ranks.push_back({.rank = w.rank, .local_rank = w.local_rank, .pid = w.child.pid,
                       .state = w.alive ? std::string(WorkerStateName(WorkerState::kHealthy))
                                        : metrics::RankStatus::Ended(
                                              w.status.success() ? "" : w.status.Describe())});
  }
  if (info_) {
    // What a user reads as restarts is what happened to this node's workers: restarted
    // (new processes) or re-formed live (the same processes); the job-wide budget spent
    // (failures and lost nodes, re-forms included) is shown beside max_restarts.
    s.joined = metrics::RoundStatus{.world_size = info_->WorldSize(),
                                    .group_rank = info_->group_rank,
                                    .group_world_size = info_->group_world_size,
                                    .restarts = std::max(0, group_.starts() - 1),
                                    .reforms = live_.reforms(),
                                    .budget_used = info_->restart_count};
  }
  o_.status->Set(s.ToJson());
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
  if (o_.rdzv.tell_start_nodes > 0 && o_.rdzv.max_nodes >= o_.rdzv.tell_start_nodes) {
    auto tell = rendezvous::RoundTell::Open();  // without it, ends are learned at the beats
    if (tell.ok()) {
      tell_ = *tell;
    } else {
      COHORT_LOG_WARN(kLog, "{}", tell.status().message());
    }
    rdzv_->UseTell(tell_);
  }
  // This agent's private runtime directory (membership channels, when it may offer them)
  // holds the sweeper's state too; the warm interpreter imports torch while the rendezvous
  // runs.
  group_.Prepare(live_.MakeRuntimeDir());
  MakeSnapshotDir();
  return std::nullopt;
}

void Agent::Impl::MakeSnapshotDir() {
  if (group_.cookie().empty()) return;
  const std::string dir = "/dev/shm/cohort-" + group_.cookie() + "-snapshots";
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
  FailureRecord f = *group_.failure();
  COHORT_LOG_WARN(kLog, "{}; stopping the worker group", f.Describe());
  metrics::DefaultRegistry()
      .GetCounter("cohort_agent_worker_failures_total", "Worker failures seen on this node")
      .Add();
  AddEvent({{"type", "failure"}, {"round", info.round}, {"cause", f.Describe()}});
  stall_report_ = group_.CollectFlightRecords(f);
  if (!stall_report_.empty()) COHORT_LOG_WARN(kLog, "{}", stall_report_);
  StopWorkers(SIGTERM);
  // Every node comes back after a failure: the next round closes once they all joined.
  auto ended = rdzv_->EndRound(
      info, RoundEnd{RoundEnd::Kind::kFailure, fmt::format("rank {}", f.rank)}, &f,
      info.group_world_size);
  if (!ended.ok()) {
    return AgentResult{kExitRendezvous,
                       fmt::format("cohort: {}; and the store is unreachable: {}", f.Describe(),
                                   ended.status().message())};
  }
  return std::nullopt;  // next round
}

std::optional<AgentResult> Agent::Impl::EndForLostPeer(const RendezvousInfo& info,
                                                       const LostPeerReport& lost) {
  RoundEnd why{RoundEnd::Kind::kDeadNode,
               fmt::format("rank {} lost a peer: {}", lost.rank, lost.reason)};
  COHORT_LOG_WARN(kLog, "round {}: {}", info.round, why.detail);
  FailureRecord record;  // no rank failed: the record says who lost whom
  record.host = o_.self.host;
  record.message = why.detail;
  // Without the lost node, most likely: the next round closes once the others joined, or,
  // a large round that knows which node it lost, is carried without it (docs/rendezvous.md).
  int lost_node = lost.peer >= 0 ? info.layout.GroupRankOf(lost.peer) : -1;
  const std::string addr = lost.peer < 0 ? LostPeerAddressIn(lost.reason) : std::string();
  if (!addr.empty() && rdzv_->Carries(info.group_world_size)) {
    // gloo names the peer's address, not its rank: its node, when one node has that address.
    lost_node = rdzv_->GroupRankAt(info, addr, Deadline::AfterMs(5000)).value_or(-1);
  }
  auto ended = lost_node >= 0 && lost_node != info.group_rank
                   ? rdzv_->EndRoundForLostNode(info, lost_node + 1, why, record)
                   : rdzv_->EndRound(info, why, &record, info.group_world_size - 1);
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
  if (const int fd = group_.zygote()->ready_fd(); fd >= 0) {
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
  const Status ready = group_.zygote()->Ready(Deadline::AfterMs(1000));
  if (ready.ok()) {
    COHORT_LOG_INFO(kLog, "warm spare: the interpreter is ready; waiting for a place");
  } else {
    COHORT_LOG_WARN(kLog, "the warm interpreter cannot start workers ({}); they start fresh",
                    ready.message());
    group_.DropZygote();
  }
  return std::nullopt;
}

AgentResult Agent::Impl::RunRounds() {
  if (auto early = Setup()) return *early;
  if (o_.rdzv.standby && group_.zygote()) {
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
    watcher.emplace(o_, *info, tell_);
    bool retry = false;
    if (auto end = BeginRound(*info, *watcher, keep, &retry)) return *end;
    if (retry) {
      keep = false;
      continue;
    }
    const RoundOutcome outcome = Monitor(watcher->fd());
    NextStep next = AfterRound(*info, outcome, watcher);
    if (next.end) return *next.end;
    keep = next.keep_workers;
  }
}

std::optional<AgentResult> Agent::Impl::BeginRound(const RendezvousInfo& info,
                                                   RoundWatcher& watcher, bool keep,
                                                   bool* retry) {
  if (keep && Announce(info, watcher.fd())) return std::nullopt;
  Status started = StartWorkers(info, watcher.fd());
  if (started.ok()) return std::nullopt;
  StopWorkers(SIGKILL);
  if (started.code() == StatusCode::kAborted && watcher.why()) {
    COHORT_LOG_WARN(kLog, "{}; joining the next round", started.message());
    rdzv_->Told(info.round, *watcher.why());
    *retry = true;  // the round ended while its workers were set up
    return std::nullopt;
  }
  int code = started.code() == StatusCode::kNotFound ? kExitNotFound : kExitInternal;
  return AgentResult{code, fmt::format("cohort: cannot start the workers: {}", started.message())};
}

NextStep Agent::Impl::AfterRound(const RendezvousInfo& info, const RoundOutcome& outcome,
                                 std::optional<RoundWatcher>& watcher) {
  using Kind = RoundOutcome::Kind;
  const std::optional<RoundEnd> why = watcher->why();
  switch (outcome.kind) {
    case Kind::kSucceeded: {
      StopWorkers(SIGKILL);  // clears leftover descendants; workers are already gone
      watcher->StopBeating();
      Status s = rdzv_->MarkFinished(info);
      if (!s.ok()) COHORT_LOG_WARN(kLog, "could not record success: {}", s.message());
      watcher.reset();
      return {Succeeded(info), false};
    }
    case Kind::kSignaled: {
      int sig = terminating_signal_.load();
      StopWorkers(sig);
      // Best effort: tells spares and a waiting store host that the job is over.
      (void)rdzv_->CloseJob(fmt::format("interrupted by {}", strsignal(sig)));
      return {AgentResult{ExitCodeForSignal(sig), fmt::format("cohort: stopped by {}", strsignal(sig))},
              false};
    }
    case Kind::kReformTimedOut: {
      const auto& workers = group_.workers();
      group_.SetFailure(FailureRecord{
          .rank = workers.empty() ? -1 : workers.front().rank,
          .host = o_.self.host,
          .message = fmt::format("the workers did not re-form in round {} within {:.0f} s; "
                                 "restarting them",
                                 info.round, settings::kReconfigTimeout.Get())});
      return {Failed(info), false};
    }
    case Kind::kFailed:
      return {Failed(info), false};
    case Kind::kPeerLost: {
      if (auto result = EndForLostPeer(info, *outcome.lost)) return {result, false};
      const bool keep = live_.Keeps(RoundEnd{RoundEnd::Kind::kDeadNode, ""}, info, group_);
      if (!keep) StopWorkers(SIGTERM);
      return {std::nullopt, keep};
    }
    case Kind::kRoundEnded: {
      if (why) rdzv_->Told(info.round, *why);  // a carried end names the next round
      const bool keep = why && live_.Keeps(*why, info, group_);
      AddEvent({{"type", keep ? "reconfigure" : "restart"}, {"round", info.round},
                {"cause", why ? why->Describe() : std::string("the rendezvous store was lost")}});
      if (!keep) StopWorkers(SIGTERM);
      return {std::nullopt, keep};
    }
  }
  return {AgentResult{kExitInternal, "cohort: unknown round outcome"}, false};
}

}  // namespace cohort::agent
