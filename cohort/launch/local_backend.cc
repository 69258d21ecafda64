// The local backend and its detached runner (see local_backend.h).
// Thread-safety: single-threaded (the runner blocks its signals and reads them from a
// signalfd in its one loop).
#include "cohort/launch/local_backend.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cohort/base/exit_codes.h"
#include "cohort/base/log.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/time.h"
#include "cohort/launch/agent_command.h"
#include "cohort/launch/job_env.h"

namespace cohort::launch {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kLog = "launch";
constexpr const char* kCancelDir = "cancel";  // requests of `cohort cancel --element`


// Field 22 of /proc/<pid>/stat: the start time, which tells a live process from a later
// one that reused its pid.
std::optional<uint64_t> StartTime(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(in, stat)) return std::nullopt;
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3 && field == "Z") return std::nullopt;  // a zombie is as good as gone
    if (i == 22) return ParseInt64(field).has_value()
                            ? std::optional<uint64_t>(static_cast<uint64_t>(*ParseInt64(field)))
                            : std::nullopt;
  }
  return std::nullopt;
}

std::string Identity(pid_t pid) {
  auto t = StartTime(pid);
  return fmt::format("{}:{}", pid, t.value_or(0));
}

// The pid of `identity` ("pid:starttime") when that very process is still alive.
std::optional<pid_t> LivePid(const std::string& identity) {
  auto parts = Split(identity, ':');
  if (parts.size() != 2) return std::nullopt;
  auto pid = ParseInt64(parts[0]);
  auto start = ParseInt64(parts[1]);
  if (!pid || !start || *pid <= 0) return std::nullopt;
  auto now = StartTime(static_cast<pid_t>(*pid));
  if (!now || static_cast<int64_t>(*now) != *start) return std::nullopt;
  return static_cast<pid_t>(*pid);
}

std::string UnitDir(const JobRecord& job, int index) {
  return job.log_dir + "/" + (index < 0 ? std::string("job") : std::to_string(index));
}

// The line of a unit's console that best says why it failed: cohort run's "first failure"
// summary, else its last own message, else the last line.
std::string FailureLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last, own, failure;
  while (std::getline(in, line)) {
    if (Trim(line).empty()) continue;
    last = line;
    if (StartsWith(line, "cohort: first failure: ")) failure = line.substr(23);
    if (StartsWith(line, "cohort: ") && !StartsWith(line, "cohort: logs: ")) own = line.substr(8);
  }
  return !failure.empty() ? failure : !own.empty() ? own : last;
}

// The `cohort run` of one unit (the job, or the element with variables `element_env`): one
// node (this machine), its own store.
std::vector<std::string> RunArgv(const JobSpec& spec, const std::string& cohort_bin,
                                 const std::string& unit_dir, const std::string& run_id,
                                 const std::map<std::string, std::string>* element_env) {
  AgentPlan plan;
  plan.nnodes = "1";
  plan.rdzv_id = run_id;
  plan.log_dir = unit_dir + "/ranks";
  plan.metrics_host = "127.0.0.1";
  return AgentArgv(spec, cohort_bin, plan, ElementArgs(spec, element_env));
}

std::vector<std::pair<std::string, std::string>> UnitEnv(
    const JobSpec& spec, const JobRecord& job, const std::map<std::string, std::string>* extra) {
  std::vector<std::pair<std::string, std::string>> env(spec.env.begin(), spec.env.end());
  if (extra) env.insert(env.end(), extra->begin(), extra->end());
  env.emplace_back(kEnvJobId, std::to_string(job.id));
  env.emplace_back(kEnvJobName, job.name);
  return env;
}

int CountGpus() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)e;
    ++n;
  }
  return n;
}

int64_t MemTotalBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  return 0;
}

class LocalBackend final : public Backend {
 public:
  explicit LocalBackend(BackendOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "local"; }
  bool RecordsOwnState() const override { return true; }

  void Validate(const JobSpec& spec, const std::vector<ArrayElement>& elements,
                std::vector<Problem>* problems) override {
    if (spec.min_nodes > 1) {
      problems->push_back(
          {"nnodes", fmt::format("'{}': the local backend runs one node (use nnodes: 1, or "
                                 "--backend slurm or kubernetes for several)",
                                 spec.NnodesText())});
    }
    if (!spec.entrypoint.empty() && !spec.module) {
      if (EndsWith(spec.entrypoint, ".py")) {  // run by the job's Python: no exec bit needed
        std::error_code ec;
        if (!fs::is_regular_file(spec.entrypoint, ec)) {
          problems->push_back(
              {"entrypoint", fmt::format("'{}' does not exist (a relative path is relative to "
                                         "the spec's directory)",
                                         spec.entrypoint)});
        }
      } else if (auto found = FindProgram(spec.entrypoint); !found.ok()) {
        problems->push_back({"entrypoint", fmt::format("'{}' {}", spec.entrypoint,
                                                       found.status().message())});
      }
    }
    const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    if (spec.resources.cpu > cpus) {
      problems->push_back({"resources.cpu", fmt::format("{} cores requested, this machine has {}",
                                                        spec.resources.cpu, cpus)});
    }
    const int64_t mem = MemTotalBytes();
    if (spec.resources.memory_bytes > 0 && mem > 0 && spec.resources.memory_bytes > mem) {
      problems->push_back(
          {"resources.memory",
           fmt::format("{} requested, this machine has {:.1f} GiB", spec.resources.memory_text,
                       mem / (1024.0 * 1024 * 1024))});
    }
    if (spec.resources.gpu > 0) {
      int gpus = CountGpus();
      if (spec.resources.gpu > gpus) {
        problems->push_back({"resources.gpu", fmt::format("{} GPU(s) requested, this machine has {}",
                                                          spec.resources.gpu, gpus)});
      }
    }
    CheckHostPathVolumes(spec, "the local backend", problems);
    CheckUnsupportedFields(spec, "local", problems);
    if (spec.metrics.port > 0 && elements.size() > 1 && Concurrency(spec, elements.size()) > 1) {
      problems->push_back(
          {"metrics.port",
           fmt::format("{} elements run at once on this machine and cannot all listen on port "
                       "{}; use port 0 (each picks a free port and prints it in its log) or "
                       "concurrency 1",
                       Concurrency(spec, elements.size()), spec.metrics.port)});
    }
    for (size_t i = 0; i < spec.volumes.size(); ++i) {
      const Volume& v = spec.volumes[i];
      std::error_code ec;
      if (!v.host_path.empty() && !fs::exists(v.host_path, ec)) {
        problems->push_back({fmt::format("volumes[{}].host_path", i),
                             fmt::format("{} does not exist on this machine", v.host_path)});
      }
    }
  }

  Result<std::string> Render(const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    JobRecord job;
    job.name = spec.name;
    job.log_dir = options_.home + "/logs/<id>";
    std::string out;
    auto line = [&](int index, const std::map<std::string, std::string>* env) {
      std::string text;
      for (const auto& [k, v] : UnitEnv(spec, job, env)) text += k + "=" + ShellQuote(v) + " ";
      out += text + ShellJoin(RunArgv(spec, options_.cohort_bin, UnitDir(job, index),
                                      spec.name + "-<id>", env)) +
             "\n";
    };
    if (elements.empty()) {
      line(-1, nullptr);
    } else {
      out += fmt::format("# {} elements, at most {} at once\n", elements.size(),
                         Concurrency(spec, elements.size()));
      for (const auto& e : elements) line(e.index, &e.env);
    }
    return out;
  }

  Result<std::string> Submit(const JobRecord& job, const JobSpec& spec,
                             const std::vector<ArrayElement>& elements) override {
    std::error_code ec;
    fs::create_directories(job.log_dir, ec);
    if (ec) return Unavailable("cannot create {}: {}", job.log_dir, ec.message());
    json list = json::array();
    for (const auto& e : elements) list.push_back({{"index", e.index}, {"env", e.env}});
    {
      std::ofstream out(job.log_dir + "/elements.json");
      out << list.dump(1) << "\n";
      if (!out) return Unavailable("cannot write {}/elements.json", job.log_dir);
    }
    SpawnOptions so;
    so.argv = {options_.cohort_bin, "_run-local-job", "--home", options_.home, "--job",
               std::to_string(job.id)};
    so.env = MergeEnvironment({});
    so.output_file = job.log_dir + "/runner.log";
    so.working_dir = options_.workdir;  // the runner's units inherit it
    so.death_signal = 0;      // the runner outlives `cohort submit`
    so.new_session = true;    // and the terminal's signals
    COHORT_ASSIGN_OR_RETURN(Child child, Spawn(so));
    ::close(child.pidfd);
    // The runner is reaped by init once `submit` exits; its identity guards against pid reuse.
    return Identity(child.pid);
  }

  Result<JobStatus> Poll(const JobRecord& job) override {
    // The job history is the local backend's engine: opened once, then read on each poll.
    if (!db_) {
      COHORT_ASSIGN_OR_RETURN(db_, JobDb::Open(JobDbPath(options_.home)));
    }
    JobDb* db = db_.get();
    COHORT_ASSIGN_OR_RETURN(JobRecord now, db->Get(job.id));
    JobStatus s;
    s.state = now.state;
    s.exit_code = now.exit_code;
    s.detail = now.detail;
    COHORT_ASSIGN_OR_RETURN(s.elements, db->Elements(job.id));
    if (!IsFinalState(now.state) && !LivePid(now.backend_id)) {
      // Re-read: the runner may have recorded its end just before exiting.
      COHORT_ASSIGN_OR_RETURN(JobRecord again, db->Get(job.id));
      if (!IsFinalState(again.state)) {
        s.state = JobState::kLost;
        s.detail = "the local runner exited without recording an end (killed, or the machine "
                   "restarted); see " + job.log_dir + "/runner.log";
        for (auto& e : s.elements) {
          if (!IsFinalState(e.state)) e.state = JobState::kLost;
        }
      } else {
        s.state = again.state;
        s.exit_code = again.exit_code;
        s.detail = again.detail;
        COHORT_ASSIGN_OR_RETURN(s.elements, db->Elements(job.id));
      }
    }
    return s;
  }

  Status Cancel(const JobRecord& job) override {
    auto pid = LivePid(job.backend_id);
    if (!pid) return FailedPrecondition("job {} is not running (its runner is gone)", job.id);
    if (::kill(*pid, SIGTERM) != 0) {
      return Unavailable("cannot signal the runner of job {} (pid {}): {}", job.id, *pid,
                         std::strerror(errno));
    }
    return Status::Ok();
  }

  // A request file <log_dir>/cancel/<element>, then SIGUSR1 to the runner (which reads the
  // requests before starting elements too, so a request made before it runs is kept).
  Status CancelElement(const JobRecord& job, int element) override {
    auto pid = LivePid(job.backend_id);
    if (!pid) return FailedPrecondition("job {} is not running (its runner is gone)", job.id);
    const fs::path dir = fs::path(job.log_dir) / kCancelDir;
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path request = dir / std::to_string(element);
    if (!std::ofstream(request)) {  // an empty file: its name is the request
      return ErrnoStatus("asking the runner to stop the element: create " + request.string(),
                         errno);
    }
    if (job.state == JobState::kRunning && ::kill(*pid, SIGUSR1) != 0) {
      return Unavailable("cannot signal the runner of job {} (pid {}): {}", job.id, *pid,
                         std::strerror(errno));
    }
    return Status::Ok();
  }

  Result<std::string> LogPath(const JobRecord& job, int element, int rank) override {
    if (job.array_size > 0 && element < 0) {
      return InvalidArgument("job {} is an array of {} elements: choose one with --element",
                             job.id, job.array_size);
    }
    if (element >= job.array_size && job.array_size > 0) {
      return InvalidArgument("job {} has elements 0..{}", job.id, job.array_size - 1);
    }
    const std::string unit = UnitDir(job, job.array_size > 0 ? element : -1);
    if (rank < 0) return unit + "/output.log";
    // The newest attempt's log of that rank: ranks/<run-id>/attempt_<k>/<rank>/stdout.log.
    std::string best;
    int best_attempt = -1;
    std::error_code ec;
    for (const auto& run : fs::directory_iterator(unit + "/ranks", ec)) {
      for (const auto& attempt : fs::directory_iterator(run.path(), ec)) {
        const std::string name = attempt.path().filename().string();
        if (name.rfind("attempt_", 0) != 0) continue;
        int k = static_cast<int>(ParseInt64(name.substr(8)).value_or(-1));
        fs::path log = attempt.path() / std::to_string(rank) / "stdout.log";
        if (k > best_attempt && fs::exists(log, ec)) {
          best_attempt = k;
          best = log.string();
        }
      }
    }
    if (best.empty()) return NotFound("no log of rank {} under {}/ranks (yet)", rank, unit);
    return best;
  }

  static int Concurrency(const JobSpec& spec, size_t units) {
    if (spec.array.concurrency > 0) return spec.array.concurrency;
    // Default: as many elements as the cores can hold workers for.
    int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    int n = std::max(1, cpus / std::max(1, spec.nproc_per_node));
    return static_cast<int>(std::min<size_t>(units, n));
  }

 private:
  BackendOptions options_;
  std::unique_ptr<JobDb> db_;  // for Poll
};

// ---- the runner ----

struct Unit {
  int index = -1;  // -1: the job itself
  std::map<std::string, std::string> env;
  Child child;
  bool started = false, done = false;
  bool cancel_requested = false;  // `cohort cancel --element`: stopped, ends cancelled
};

class Runner {
 public:
  Runner(std::string home, int64_t id, std::string cohort_bin)
      : home_(std::move(home)), id_(id), cohort_bin_(std::move(cohort_bin)) {}

  int Run() {
    auto db = JobDb::Open(JobDbPath(home_));
    if (!db.ok()) return Fail(db.status());
    db_ = std::move(db).value();
    auto job = db_->Get(id_);
    if (!job.ok()) return Fail(job.status());
    job_ = *job;
    std::vector<Problem> problems;
    spec_ = ParseJobSpec(job_.spec_yaml, &problems);
    if (!problems.empty()) {
      return Finish(JobState::kFailed, 1,
                    "the stored job spec is invalid:\n" + FormatProblems(problems));
    }
    if (Status s = LoadUnits(); !s.ok()) return Finish(JobState::kFailed, 1, s.message());

    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&set, sig);
    ::sigprocmask(SIG_BLOCK, &set, nullptr);
    sig_fd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);

    job_.state = JobState::kRunning;
    job_.started_at = WallSeconds();
    (void)db_->Update(job_);
    const int limit = LocalBackend::Concurrency(spec_, units_.size());
    COHORT_LOG_INFO(kLog, "job {}: {} unit(s), at most {} at once", id_, units_.size(), limit);

    for (;;) {
      CancelRequestedElements();
      int running = 0;
      for (auto& u : units_) running += u.started && !u.done;
      for (auto& u : units_) {
        if (cancelling_ || running >= limit) break;
        if (u.started) continue;
        StartUnit(u);
        if (u.started && !u.done) ++running;
      }
      if (running == 0) break;
      WaitOnce();
    }
    if (cancelling_) {
      for (auto& u : units_) {
        if (!u.started) {
          RecordUnit(u, JobState::kCancelled, std::nullopt, "cancelled before it started");
        }
      }
      return Finish(JobState::kCancelled, 143, "cancelled by request");
    }
    // Elements cancelled on request are neither failures nor the job's end.
    const JobState state = AggregateElementStates(results_);
    int failed = 0, cancelled = 0;
    std::optional<int> first_code;
    std::string first_detail;
    for (const auto& r : results_) {
      if (r.state == JobState::kCancelled) {
        ++cancelled;
      } else if (r.state != JobState::kSucceeded) {
        ++failed;
        if (!first_code) {
          first_code = r.exit_code;
          first_detail = r.detail;
        }
      }
    }
    if (state == JobState::kCancelled) {
      return Finish(state, 143, "every element was cancelled by request");
    }
    if (state == JobState::kSucceeded) {
      return Finish(state, 0,
                    cancelled ? fmt::format("{} element(s) cancelled by request", cancelled) : "");
    }
    std::string detail = units_.size() > 1
                             ? fmt::format("{} of {} elements failed; first: {}", failed,
                                           units_.size(), first_detail)
                             : first_detail;
    return Finish(JobState::kFailed, first_code.value_or(1), detail);
  }

 private:
  Status LoadUnits() {
    if (job_.array_size == 0) {
      units_.push_back(Unit{});
      return Status::Ok();
    }
    std::ifstream in(job_.log_dir + "/elements.json");
    json list = json::parse(in, nullptr, false);
    if (list.is_discarded() || !list.is_array() ||
        list.size() != static_cast<size_t>(job_.array_size)) {
      return DataLoss("{}/elements.json is missing or damaged", job_.log_dir);
    }
    for (const auto& e : list) {
      Unit u;
      u.index = e.value("index", -1);
      u.env = e.value("env", std::map<std::string, std::string>{});
      units_.push_back(std::move(u));
    }
    return Status::Ok();
  }

  void StartUnit(Unit& u) {
    const std::string dir = UnitDir(job_, u.index);
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string run_id =
        u.index < 0 ? fmt::format("job{}", id_) : fmt::format("job{}-{}", id_, u.index);
    SpawnOptions so;
    so.argv = RunArgv(spec_, cohort_bin_, dir, run_id, u.index < 0 ? nullptr : &u.env);
    so.env = MergeEnvironment(UnitEnv(spec_, job_, u.index < 0 ? nullptr : &u.env));
    so.output_file = dir + "/output.log";
    u.started = true;
    ElementRecord rec;
    rec.index = u.index;
    rec.log_dir = dir;
    rec.started_at = WallSeconds();
    auto child = Spawn(so);
    if (!child.ok()) {
      u.done = true;
      RecordUnit(u, JobState::kFailed, 127, child.status().message());
      return;
    }
    u.child = *child;
    rec.state = JobState::kRunning;
    if (u.index >= 0) (void)db_->UpdateElement(id_, rec);
    started_at_[u.index] = rec.started_at;
  }

  // Waits for a child to exit or a signal; handles whichever came.
  void WaitOnce() {
    std::vector<pollfd> fds = {{sig_fd_, POLLIN, 0}};
    std::vector<Unit*> owners = {nullptr};
    for (auto& u : units_) {
      if (u.started && !u.done) {
        fds.push_back({u.child.pidfd, POLLIN, 0});
        owners.push_back(&u);
      }
    }
    int rc = ::poll(fds.data(), fds.size(), -1);
    if (rc < 0) return;
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (::read(sig_fd_, &info, sizeof(info)) == sizeof(info)) {
        if (info.ssi_signo == SIGUSR1) {  // `cohort cancel --element`
          CancelRequestedElements();
          continue;
        }
        if (!cancelling_) {
          COHORT_LOG_INFO(kLog, "job {}: signal {}: stopping", id_, info.ssi_signo);
        }
        cancelling_ = true;
        for (auto& u : units_) {
          if (u.started && !u.done) SignalGroup(u.child.pid, SIGTERM);
        }
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      Unit& u = *owners[i];
      ExitStatus st = Reap(u.child.pid);
      ::close(u.child.pidfd);
      u.done = true;
      const int code = st.exited ? st.code : ExitCodeForSignal(st.signal);
      const std::string out = UnitDir(job_, u.index) + "/output.log";
      const bool stopped = cancelling_ || u.cancel_requested;
      const JobState state = st.success() ? JobState::kSucceeded
                             : stopped    ? JobState::kCancelled
                                          : JobState::kFailed;
      RecordUnit(u, state, code,
                 st.success()           ? ""
                 : u.cancel_requested ? "cancelled by request (cohort cancel --element)"
                                      : FailureLine(out));
    }
  }

  // The requests of `cohort cancel --element` (files <log_dir>/cancel/<index>): an element
  // not started yet is never started; a running one is stopped (its process group gets
  // SIGTERM, as on cancel). Each request file is removed once handled.
  void CancelRequestedElements() {
    std::error_code ec;
    const fs::path dir = fs::path(job_.log_dir) / kCancelDir;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::optional<int64_t> index = ParseInt64(e.path().filename().string());
      fs::remove(e.path(), ec);
      if (!index) continue;
      for (Unit& u : units_) {
        if (u.index != *index || u.done || u.cancel_requested) continue;
        u.cancel_requested = true;
        if (!u.started) {
          u.started = u.done = true;
          RecordUnit(u, JobState::kCancelled, std::nullopt,
                     "cancelled by request before it started");
        } else {
          COHORT_LOG_INFO(kLog, "job {}: stopping element {} (cancel requested)", id_, u.index);
          SignalGroup(u.child.pid, SIGTERM);
        }
      }
    }
  }

  void RecordUnit(const Unit& u, JobState state, std::optional<int> code,
                  const std::string& detail) {
    ElementRecord rec;
    rec.index = u.index;
    rec.state = state;
    rec.exit_code = code;
    rec.started_at = started_at_.count(u.index) ? started_at_[u.index] : 0;
    rec.ended_at = WallSeconds();
    rec.log_dir = UnitDir(job_, u.index);
    rec.detail = detail;
    results_.push_back(rec);
    if (u.index >= 0) (void)db_->UpdateElement(id_, rec);
  }

  int Finish(JobState state, int code, const std::string& detail) {
    job_.state = state;
    job_.exit_code = code;
    job_.ended_at = WallSeconds();
    job_.detail = detail;
    if (db_) {
      Status s = db_->Update(job_).status();
      if (!s.ok()) COHORT_LOG_ERROR(kLog, "job {}: cannot record the end: {}", id_, s.message());
    }
    COHORT_LOG_INFO(kLog, "job {}: {} (exit {}) {}", id_, StateName(state), code, detail);
    return code;
  }

  int Fail(const Status& s) {
    COHORT_LOG_ERROR(kLog, "job {}: {}", id_, s.message());
    return 70;
  }

  std::string home_;
  int64_t id_;
  std::string cohort_bin_;
  std::unique_ptr<JobDb> db_;
  JobRecord job_;
  JobSpec spec_;
  std::vector<Unit> units_;
  std::vector<ElementRecord> results_;
  std::map<int, double> started_at_;
  int sig_fd_ = -1;
  bool cancelling_ = false;
};

}  // namespace

std::unique_ptr<Backend> MakeLocalBackend(const BackendOptions& options) {
  return std::make_unique<LocalBackend>(options);
}

int RunLocalJob(const std::string& home, int64_t job_id, const std::string& cohort_bin) {
  Runner runner(home, job_id, cohort_bin);
  return runner.Run();
}

std::string DefaultCohortHome() {
  if (!settings::kHome.Get().empty()) return settings::kHome.Get();
  if (auto h = SystemEnv("HOME")) return *h + "/.cohort";
  return "/tmp/cohort-home";
}

std::string JobDbPath(const std::string& home) { return home + "/jobs.db"; }

}  // namespace cohort::launch
