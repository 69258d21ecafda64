// Implements the node's worker group (worker_group.h). Single-threaded: only the agent's
// monitor thread calls in.
#include "cohort/agent/worker_group.h"

#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cohort/base/file.h"
#include "cohort/base/flight_record.h"
#include "cohort/base/log.h"
#include "cohort/metrics/registry.h"

namespace cohort::agent {

namespace fs = std::filesystem;
using rendezvous::FailureRecord;

namespace {
constexpr const char* kLog = "agent";

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

// Waits (bounded) for `expected` close-after-write events on inotify descriptor `in`.
void AwaitDumps(int in, int expected, Deadline deadline) {
  while (in >= 0 && expected > 0 && !deadline.expired()) {
    pollfd p{in, POLLIN, 0};
    if (::poll(&p, 1, deadline.PollTimeoutMs()) <= 0) break;
    alignas(inotify_event) char buf[4096];
    ssize_t n = ::read(in, buf, sizeof(buf));
    for (ssize_t off = 0; n > 0 && off < n;) {
      auto* ev = reinterpret_cast<inotify_event*>(buf + off);
      if (ev->mask & IN_CLOSE_WRITE) --expected;
      off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
    }
  }
}

}  // namespace

WorkerGroup::WorkerGroup(const AgentOptions& options, std::function<void()> on_change,
                         std::function<void(int, std::string_view)> on_line)
    : o_(options), on_change_(std::move(on_change)), on_line_(std::move(on_line)) {}

WorkerGroup::~WorkerGroup() { Stop(SIGKILL); }

void WorkerGroup::Prepare(const std::string& runtime_dir) {
  sweeper_ = std::make_unique<JobSweeper>(runtime_dir);
  StartZygote();  // imports torch while the rendezvous runs
}

const std::string& WorkerGroup::cookie() const {
  static const std::string kNone;
  return sweeper_ ? sweeper_->cookie() : kNone;
}

std::string WorkerGroup::FlightRecordDir(int rank) const {
  // The user's directory, else the rank's log directory of the attempt.
  return o_.spec.flight_recorder_dir.empty() ? fmt::format("{}/{}", attempt_dir_, rank)
                                             : o_.spec.flight_recorder_dir;
}

int WorkerGroup::OmpThreadsForWorkers() const {
  // As torchrun: one intra-op thread per worker when several share the node, unless the
  // user chose a number.
  return !worker_env::Inherited(worker_env::kOmpNumThreads) && o_.spec.nproc_per_node > 1;
}

void WorkerGroup::StartZygote() {
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

Result<Child> WorkerGroup::SpawnWorker(const SpawnOptions& so) {
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

// One console merger per stream, sized by the ranks that print to it.
void WorkerGroup::MakeConsoles() {
  const WorkerSpec& spec = o_.spec;
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
}

Status WorkerGroup::Start(const GroupStart& start) {
  const int attempt = starts_++;
  attempt_dir_ = fmt::format("{}/{}/attempt_{}", o_.spec.log_dir, o_.spec.run_id, attempt);
  failure_.reset();
  workers_.clear();
  workers_.reserve(o_.spec.nproc_per_node);
  MakeConsoles();
  for (int local = 0; local < o_.spec.nproc_per_node; ++local) {
    COHORT_RETURN_IF_ERROR(SpawnOne(start, attempt, local));
  }
  state_ = WorkerState::kHealthy;
  for (const auto& w : workers_) PublishWorker(w);
  on_change_();
  const int offset = start.info.RankOffset();
  COHORT_LOG_DEBUG(kLog, "attempt {}: started {} worker(s), ranks {}..{} of {}", attempt,
                   o_.spec.nproc_per_node, offset, offset + o_.spec.nproc_per_node - 1,
                   start.info.WorldSize());
  return Status::Ok();
}

Status WorkerGroup::SpawnOne(const GroupStart& start, int attempt, int local) {
  const WorkerSpec& spec = o_.spec;
  const rendezvous::RendezvousInfo& info = start.info;
  Worker w;
  w.local_rank = local;
  w.rank = info.RankOffset() + local;
  std::string dir = fmt::format("{}/{}", attempt_dir_, w.rank);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Internal("cannot create log directory {}: {}", dir, ec.message());
  w.error_file = dir + "/error.json";
  fs::remove(w.error_file, ec);
  WorkerEnv we;
  we.rank = w.rank;
  we.local_rank = local;
  we.world_size = info.WorldSize();
  we.local_world_size = spec.nproc_per_node;
  we.group_rank = info.group_rank;
  we.group_world_size = info.group_world_size;
  we.role_rank = w.rank;
  we.role_world_size = info.WorldSize();
  we.role_name = spec.role;
  we.master_addr = start.master.first;
  we.master_port = start.master.second;
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
  we.job_cookie = cookie();
  we.listen_addr = spec.listen_addr;
  we.flight_recorder_dir = FlightRecordDir(w.rank);
  we.metrics_dir = o_.metrics_dir;
  we.membership_dir = start.membership_dir;
  we.snapshot_dir = start.snapshot_dir;
  we.membership_secret = start.membership_dir.empty() ? "" : start.membership_secret;
  SpawnOptions so;
  so.argv = spec.argv;
  so.env = WorkerEnvironment(we, spec.extra_env);
  COHORT_ASSIGN_OR_RETURN(w.child, SpawnWorker(so));
  w.alive = true;
  const bool shown = spec.local_ranks_filter.empty() || spec.local_ranks_filter.count(local);
  const int redirect = spec.redirects.For(local), tee = spec.tee.For(local);
  auto console = [&](int bit, ConsoleMerger* merger) {
    bool to_console = shown && (!(redirect & bit) || (tee & bit));
    return to_console ? merger : nullptr;
  };
  w.out = std::make_unique<LogSink>(w.rank, console(1, out_console_.get()), dir + "/stdout.log",
                                    on_line_);
  w.err = std::make_unique<LogSink>(w.rank, console(2, err_console_.get()), dir + "/stderr.log",
                                    on_line_);
  workers_.push_back(std::move(w));
  return Status::Ok();
}

void WorkerGroup::CloseWorkerPipes(Worker& w) {
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

void WorkerGroup::OnWorkerExit(Worker& w) {
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
  on_change_();
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

void WorkerGroup::AddPollFds(PollSet& set) const {
  using Kind = PollTag::Kind;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (w.alive) set.Add(w.child.pidfd, {Kind::kWorkerExit, i});
    if (w.child.out_fd >= 0) set.Add(w.child.out_fd, {Kind::kWorkerStdout, i});
    if (w.child.err_fd >= 0) set.Add(w.child.err_fd, {Kind::kWorkerStderr, i});
  }
}

bool WorkerGroup::Handle(const PollTag& tag) {
  Worker& w = workers_[tag.worker];
  switch (tag.kind) {
    case PollTag::Kind::kWorkerExit:
      OnWorkerExit(w);
      return true;
    case PollTag::Kind::kWorkerStdout:
      if (w.child.out_fd >= 0 && !w.out->Drain(w.child.out_fd)) {
        ::close(w.child.out_fd);
        w.child.out_fd = -1;
      }
      return false;
    case PollTag::Kind::kWorkerStderr:
      if (w.child.err_fd >= 0 && !w.err->Drain(w.child.err_fd)) {
        ::close(w.child.err_fd);
        w.child.err_fd = -1;
      }
      return false;
    default:
      return false;
  }
}

std::optional<WorkerGroup::End> WorkerGroup::CheckEnd() {
  if (failure_) {
    state_ = WorkerState::kFailed;
    return End::kFailed;
  }
  if (!AllExited()) return std::nullopt;
  state_ = WorkerState::kSucceeded;
  return End::kSucceeded;
}

bool WorkerGroup::ReapExited() {
  bool all_alive = true;
  for (auto& w : workers_) {
    pollfd p{w.child.pidfd, POLLIN, 0};
    if (w.alive && ::poll(&p, 1, 0) > 0) OnWorkerExit(w);
    all_alive = all_alive && w.alive;
  }
  return all_alive;
}

bool WorkerGroup::AllExited() const {
  for (const auto& w : workers_) {
    if (w.alive) return false;
  }
  return true;
}

void WorkerGroup::Renumber(int offset) {
  for (auto& w : workers_) {
    // What the worker wrote so far carries its old rank; later lines its new one.
    if (w.child.out_fd >= 0) w.out->Drain(w.child.out_fd);
    if (w.child.err_fd >= 0) w.err->Drain(w.child.err_fd);
    w.rank = offset + w.local_rank;
    w.out->SetRank(w.rank);
    w.err->SetRank(w.rank);
  }
}

void WorkerGroup::Reformed() {
  state_ = WorkerState::kHealthy;
  for (const auto& w : workers_) PublishWorker(w);
  on_change_();
}

int WorkerGroup::ConsoleTimeoutMs() const {
  int timeout = -1;
  for (ConsoleMerger* m : {out_console_.get(), err_console_.get()}) {
    const int t = m ? m->PollTimeoutMs() : -1;
    if (t >= 0 && (timeout < 0 || t < timeout)) timeout = t;
  }
  return timeout;
}

void WorkerGroup::FlushDueConsoles() {
  if (out_console_) out_console_->FlushDue();
  if (err_console_) err_console_->FlushDue();
}

void WorkerGroup::ForwardSignal(int sig) {
  for (auto& w : workers_) {
    if (w.alive) SignalGroup(w.child.pid, sig);
  }
}

void WorkerGroup::Stop(int first_signal) {
  if (workers_.empty()) return;
  ForwardSignal(first_signal);
  Deadline grace = Deadline::After(o_.spec.stop_grace);
  for (;;) {
    PollSet live;
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i].alive) live.Add(workers_[i].child.pidfd, {PollTag::Kind::kWorkerExit, i});
    }
    if (live.fds.empty() || grace.expired()) break;
    int rc = ::poll(live.fds.data(), live.fds.size(), grace.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) break;
    for (size_t k = 0; k < live.fds.size(); ++k) {
      if (live.fds[k].revents) OnWorkerExit(workers_[live.tags[k].worker]);
    }
    // No worker may block on a full pipe during its grace period.
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
    // No descendant in the worker's process group outlives the attempt.
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
  on_change_();  // the ranks' last states stay visible until the next attempt
  workers_.clear();
  state_ = WorkerState::kStopped;
}

void WorkerGroup::PublishWorker(const Worker& w) {
  metrics::DefaultRegistry()
      .GetGauge("cohort_agent_worker_up", "1 while the worker process of this rank runs",
                {{"rank", std::to_string(w.rank)}})
      .Set(w.alive ? 1 : 0);
}

std::string WorkerGroup::CollectFlightRecords(const FailureRecord& failure) {
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
    if (in >= 0) ::inotify_add_watch(in, FlightRecordDir(w.rank).c_str(), IN_CLOSE_WRITE);
    SignalGroup(w.child.pid, SIGUSR1);
    ++waiting;
  }
  AwaitDumps(in, waiting, Deadline::AfterMs(1000));
  if (in >= 0) ::close(in);
  std::string report;
  std::vector<std::pair<int, long>> last_seq;  // (rank, sequence of its last operation)
  long newest = -1;
  std::string newest_op;
  for (const auto& w : workers_) {
    auto text = ReadFileToString(dump_path(w));
    std::optional<FlightRecordEntry> e = text.ok() ? LastFlightRecordEntry(*text) : std::nullopt;
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

}  // namespace cohort::agent
