// The local pipeline executor (see executor.h). Thread-safety: the coordinator owns the
// RunDb and the step records; step threads share only the event queue (Execution::events_,
// guarded by Execution::mu_) and the two eventfds.
#include "cohort/pipeline/executor.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "cohort/base/backoff.h"
#include "cohort/base/event_fd.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/file.h"
#include "cohort/base/mutex.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/sweeper.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/launch/array.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/job_env.h"
#include "cohort/launch/job_spec.h"
#include "cohort/launch/local_backend.h"
#include "cohort/launch/submit.h"
#include "cohort/launch/targets.h"
#include "cohort/pipeline/run_db.h"

namespace cohort::pipeline {
namespace {

namespace fs = std::filesystem;
using OutputMap = std::map<std::string, std::map<std::string, std::string>>;


std::string Absolute(const std::string& base, const std::string& p) {
  fs::path path(p);
  std::string out = (path.is_absolute() ? path : fs::path(base) / path).lexically_normal().string();
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// Waits until one of `fds` is readable or `timeout_ms` passes (-1: forever). Returns the
// index of a readable fd, or -1 on timeout.
int WaitAny(const std::vector<int>& fds, int timeout_ms) {
  std::vector<pollfd> p;
  for (int fd : fds) p.push_back({fd, POLLIN, 0});
  for (;;) {
    int rc = ::poll(p.data(), p.size(), timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return -1;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i].revents) return static_cast<int>(i);
    }
    return -1;
  }
}


std::string Seconds(double s) { return fmt::format("{:.1f}s", s); }

// An event from a step thread.
struct Event {
  enum class Kind { kAttempt, kAttemptFailed, kDone };
  Kind kind = Kind::kDone;
  size_t step = 0;
  int attempt = 0;
  StepState state = StepState::kFailed;  // kDone: succeeded | failed | cancelled
  std::optional<int> exit_code;
  std::string detail;
  std::map<std::string, std::string> outputs;
};

Event MakeEvent(Event::Kind kind, size_t step, int attempt = 0) {
  Event e;
  e.kind = kind;
  e.step = step;
  e.attempt = attempt;
  return e;
}

class Execution {
 public:
  Execution(const PipelineSpec& spec, RunRecord run, std::vector<StepRecord> records,
            RunDb* db, const ExecutorOptions& options)
      : spec_(spec), run_(std::move(run)), records_(std::move(records)), db_(db),
        options_(options) {}
  ~Execution() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  Result<RunOutcome> Run() {
    std::vector<Problem> problems;
    order_ = TopologicalOrder(spec_, &problems);
    if (!problems.empty()) return InvalidArgument("{}", launch::FormatProblems(problems));
    threads_.resize(spec_.steps.size());
    for (size_t i = 0; i < records_.size(); ++i) {
      if (IsDone(records_[i].state)) outputs_[spec_.steps[i].name] = records_[i].outputs;
    }
    bool cancelled = false;
    for (;;) {
      if (!cancelled) Schedule();
      if (running_ == 0 && (cancelled || AllFinal())) break;
      int which = WaitAny({events_ready_.fd(), options_.cancel_fd >= 0 ? options_.cancel_fd : events_ready_.fd()},
                          -1);
      if (which == 1 && options_.cancel_fd >= 0 && !cancelled) {
        cancelled = true;
        Progress(fmt::format("[{}] cancelling: stopping {} running step(s)", spec_.name,
                             running_));
        stop_.Notify();
      }
      events_ready_.Drain();
      HandleEvents();
    }
    RunState state = RunState::kSucceeded;
    for (size_t i = 0; i < records_.size(); ++i) {
      auto& r = records_[i];
      if (cancelled && !IsFinal(r.state)) {
        r.state = StepState::kCancelled;
        r.detail = "the run was cancelled before it started";
        Put(i);
      }
      if (r.state == StepState::kCancelled) state = RunState::kCancelled;
      if ((r.state == StepState::kFailed || r.state == StepState::kNotRun) &&
          state != RunState::kCancelled) {
        state = RunState::kFailed;
      }
    }
    if (cancelled) state = RunState::kCancelled;
    run_.state = state;
    run_.exit_code = state == RunState::kSucceeded ? 0 : 1;
    run_.ended_at = WallSeconds();
    COHORT_RETURN_IF_ERROR(db_->UpdateRun(run_));
    return RunOutcome{run_.id, state};
  }

 private:
  void Progress(const std::string& line) {
    if (options_.progress) options_.progress(line);
  }
  void Put(size_t i) {
    Status st = db_->PutStep(run_.id, records_[i]);
    if (!st.ok()) Progress(fmt::format("warning: {}", st.message()));
  }
  bool AllFinal() const {
    for (const auto& r : records_) {
      if (!IsFinal(r.state)) return false;
    }
    return true;
  }

  void Finish(size_t i, StepState state, const std::string& detail, std::string line) {
    auto& r = records_[i];
    r.state = state;
    r.detail = detail;
    if (r.started_at == 0) r.started_at = WallSeconds();
    r.ended_at = WallSeconds();
    Put(i);
    Progress(fmt::format("[{}] {}", spec_.steps[i].name, line));
  }

  // Step 1 of the protocol: decide every pending step whose dependencies are final.
  void Schedule() {
    for (size_t i : order_) {
      auto& r = records_[i];
      if (r.state != StepState::kPending) continue;
      const Step& s = spec_.steps[i];
      std::string blocker;
      bool ready = true;
      for (const auto& d : s.depends) {
        const StepRecord& dr = records_[Index(d)];
        if (!IsFinal(dr.state)) {
          ready = false;
          break;
        }
        if (!IsDone(dr.state) && blocker.empty()) blocker = d;
      }
      if (!ready) continue;
      if (!blocker.empty()) {
        const std::string_view why = StateName(records_[Index(blocker)].state);
        Finish(i, StepState::kNotRun, fmt::format("dependency '{}' {}", blocker, why),
               fmt::format("not run (dependency '{}' {})", blocker, why));
        continue;
      }
      if (s.condition) {
        auto result = EvaluateCondition(*s.condition, [&](const Ref& ref) -> Result<Value> {
          if (ref.kind == Ref::Kind::kParam) {
            const Parameter* p = spec_.FindParam(ref.param);
            auto it = run_.params.find(ref.param);
            if (!p || it == run_.params.end()) return NotFound("unknown parameter '{}'", ref.param);
            return ParamValue(*p, it->second);
          }
          COHORT_ASSIGN_OR_RETURN(std::string v, LookupOutput(ref));
          return Value::String(v);
        });
        if (!result.ok()) {
          Finish(i, StepState::kFailed, "condition: " + result.status().message(),
                 "failed: condition: " + result.status().message());
          continue;
        }
        if (!*result) {
          Finish(i, StepState::kSkipped, "condition false: " + s.when, "skipped (condition false)");
          continue;
        }
      }
      auto resolved = ResolveStep(s, spec_.base_dir, run_.params, outputs_);
      if (!resolved.ok()) {
        Finish(i, StepState::kFailed, resolved.status().message(),
               "failed: " + resolved.status().message());
        continue;
      }
      r.log_dir = RunLogDir(options_.home, run_.id) + "/" + s.name;
      if (s.cache) {
        auto key = CacheKey(s.name, *resolved);
        if (!key.ok()) {
          Finish(i, StepState::kFailed, key.status().message(), "failed: " + key.status().message());
          continue;
        }
        r.cache_key = *key;
        auto hit = db_->FindCached(spec_.name, s.name, *key);
        bool files_there = true;
        for (const auto& f : resolved->output_files) files_there = files_there && fs::exists(f);
        if (hit.ok() && hit->has_value() && files_there) {
          r.outputs = (*hit)->outputs;
          outputs_[s.name] = r.outputs;
          r.exit_code = 0;
          Finish(i, StepState::kCached, "unchanged since an earlier run", "cached");
          continue;
        }
      }
      if (running_ >= options_.parallel) continue;
      r.state = StepState::kRunning;
      r.started_at = WallSeconds();
      r.ended_at = 0;
      r.exit_code.reset();
      r.detail.clear();
      Put(i);
      ++running_;
      if (threads_[i].joinable()) threads_[i].join();
      threads_[i] = std::thread([this, i, step = std::move(resolved).value()] {
        RunStep(i, step);
      });
    }
  }

  size_t Index(const std::string& name) const {
    for (size_t i = 0; i < spec_.steps.size(); ++i) {
      if (spec_.steps[i].name == name) return i;
    }
    return 0;  // validated: every name exists
  }

  Result<std::string> LookupOutput(const Ref& ref) {
    auto it = outputs_.find(ref.step);
    const StepRecord& r = records_[Index(ref.step)];
    if (r.state == StepState::kSkipped) {
      return FailedPrecondition("step '{}' was skipped, so its output '{}' does not exist",
                                ref.step, ref.output);
    }
    if (it == outputs_.end() || !it->second.count(ref.output)) {
      return FailedPrecondition("step '{}' has no output '{}'", ref.step, ref.output);
    }
    return it->second.at(ref.output);
  }

  void HandleEvents() COHORT_EXCLUDES(mu_) {
    std::deque<Event> events;
    {
      MutexLock lock(&mu_);
      events.swap(events_);
    }
    for (auto& e : events) {
      auto& r = records_[e.step];
      const Step& s = spec_.steps[e.step];
      switch (e.kind) {
        case Event::Kind::kAttempt:
          r.attempts++;
          Put(e.step);
          Progress(e.attempt == 1 ? fmt::format("[{}] running", s.name)
                                  : fmt::format("[{}] running (attempt {}/{})", s.name,
                                                e.attempt, s.retries + 1));
          break;
        case Event::Kind::kAttemptFailed:
          r.exit_code = e.exit_code;
          r.detail = e.detail;
          Put(e.step);
          Progress(fmt::format("[{}] failed: {} (retry {}/{})", s.name, e.detail, e.attempt,
                               s.retries));
          break;
        case Event::Kind::kDone: {
          --running_;
          r.exit_code = e.exit_code;
          r.outputs = e.outputs;
          if (e.state == StepState::kSucceeded) outputs_[s.name] = e.outputs;
          double took = WallSeconds() - r.started_at;
          std::string line =
              e.state == StepState::kSucceeded ? fmt::format("succeeded ({})", Seconds(took))
              : e.state == StepState::kCancelled ? "cancelled"
                                       : fmt::format("failed: {}", e.detail);
          Finish(e.step, e.state, e.detail, line);
          break;
        }
      }
    }
  }

  void Post(Event e) COHORT_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      events_.push_back(std::move(e));
    }
    events_ready_.Notify();
  }

  // Step 2 of the protocol, on the step's own thread.
  void RunStep(size_t i, const ResolvedStep& step) {
    const Step& s = spec_.steps[i];
    const std::string log_dir = RunLogDir(options_.home, run_.id) + "/" + s.name;
    const std::string outputs_dir = log_dir + "/outputs";
    std::error_code ec;
    fs::create_directories(outputs_dir, ec);
    Event done = MakeEvent(Event::Kind::kDone, i);
    for (int attempt = 1; attempt <= s.retries + 1; ++attempt) {
      Post(MakeEvent(Event::Kind::kAttempt, i, attempt));
      fs::remove_all(outputs_dir, ec);
      fs::create_directories(outputs_dir, ec);
      {
        std::ofstream(log_dir + "/output.log", std::ios::app)
            << fmt::format("=== cohort pipeline: step {} attempt {}/{} ===\n", s.name, attempt,
                           s.retries + 1);
      }
      Event r = step.job_text.empty() ? RunCommand(i, step, log_dir, outputs_dir, attempt)
                                      : RunJob(i, step, log_dir, outputs_dir);
      if (r.state == StepState::kSucceeded) {
        // Values and files the step declared.
        for (const auto& name : step.output_values) {
          auto read = ReadFileToString(outputs_dir + "/" + name);
          if (!read.ok()) {
            r.state = StepState::kFailed;
            r.detail = fmt::format("the step did not write its output '{}' (${}/{})", name,
                                   launch::kEnvOutputs, name);
            break;
          }
          std::string v = std::move(*read);
          while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
          r.outputs[name] = v;
        }
        for (const auto& f : step.output_files) {
          if (r.state == StepState::kSucceeded && !fs::exists(f)) {
            r.state = StepState::kFailed;
            r.detail = fmt::format("the step did not create its output file {}", f);
          }
        }
      }
      if (r.state != StepState::kFailed || attempt == s.retries + 1 || stop_.Readable()) {
        done.state = r.state;
        done.exit_code = r.exit_code;
        done.detail = r.detail;
        done.outputs = r.outputs;
        break;
      }
      Event failed = MakeEvent(Event::Kind::kAttemptFailed, i, attempt);
      failed.exit_code = r.exit_code;
      failed.detail = r.detail;
      Post(std::move(failed));
    }
    Post(std::move(done));
  }

  // Stops the process group of `pid`: SIGTERM, then SIGKILL after the grace period.
  ExitStatus Stop(const Child& child) {
    SignalGroup(child.pid, SIGTERM);
    if (WaitAny({child.pidfd}, static_cast<int>(options_.kill_grace_s * 1000)) < 0) {
      SignalGroup(child.pid, SIGKILL);
    }
    WaitAny({child.pidfd}, -1);
    ExitStatus st = Reap(child.pid);
    SignalGroup(child.pid, SIGKILL);  // anything of the group still alive
    return st;
  }

  Event RunCommand(size_t i, const ResolvedStep& step, const std::string& log_dir,
                   const std::string& outputs_dir, int attempt) {
    Event r = MakeEvent(Event::Kind::kDone, i);
    std::vector<std::pair<std::string, std::string>> env(step.env.begin(), step.env.end());
    env.push_back({launch::kEnvOutputs, outputs_dir});
    env.push_back({launch::kEnvPipeline, spec_.name});
    env.push_back({launch::kEnvPipelineRun, std::to_string(run_.id)});
    env.push_back({launch::kEnvPipelineStep, spec_.steps[i].name});
    env.push_back({launch::kEnvStepAttempt, std::to_string(attempt)});
    env.push_back({launch::kEnvSpecDir, spec_.base_dir});
    if (spec_.workspace) env.push_back({launch::kEnvWorkspace, spec_.base_dir});
    const std::string part = fmt::format("{}-{}", i, attempt);
    env.push_back({worker_env::kJobCookie, sweeper_.CookieFor(part)});
    SpawnOptions so;
    so.argv = step.argv;
    so.env = MergeEnvironment(env);
    so.working_dir = step.workdir;
    so.capture_output = false;
    so.output_file = log_dir + "/output.log";
    auto child = Spawn(so);
    if (!child.ok()) {
      r.state = StepState::kFailed;
      r.detail = child.status().message();
      return r;
    }
    const double timeout = spec_.steps[i].timeout_s;
    int wait_ms = timeout > 0 ? static_cast<int>(timeout * 1000) : -1;
    int which = WaitAny({child->pidfd, stop_.fd()}, wait_ms);
    ExitStatus st;
    if (which == 0) {
      st = Reap(child->pid);
      SignalGroup(child->pid, SIGKILL);  // whatever it left behind in its group
    } else {
      st = Stop(*child);
    }
    ::close(child->pidfd);
    sweeper_.Sweep(part);  // and what left the group
    if (which == 1) {
      r.state = StepState::kCancelled;
      r.detail = "stopped: the run was cancelled";
    } else if (which < 0) {
      r.state = StepState::kFailed;
      r.detail = fmt::format("timed out after {}s (process group killed)", timeout);
    } else if (st.success()) {
      r.state = StepState::kSucceeded;
      r.exit_code = 0;
    } else {
      r.state = StepState::kFailed;
      r.exit_code = st.exited ? st.code : ExitCodeForSignal(st.signal);
      r.detail = st.Describe();
    }
    return r;
  }

  Event RunJob(size_t i, const ResolvedStep& step, const std::string& log_dir,
               const std::string& outputs_dir) {
    Event r = MakeEvent(Event::Kind::kDone, i);
    r.state = StepState::kFailed;
    std::ofstream log(log_dir + "/output.log", std::ios::app);
    std::vector<Problem> problems;
    launch::JobSpec js = launch::ParseJobSpec(step.job_text, &problems);
    js.env[launch::kEnvOutputs] = outputs_dir;
    if (spec_.workspace) js.env[launch::kEnvWorkspace] = spec_.base_dir;
    const std::string backend_name = launch::BackendOfSpec(js, step.backend);
    if (launch::SharesSubmitHostFiles(js, backend_name)) {
      launch::ResolveEntrypointPath(&js, fs::path(step.job_path).parent_path().string());
    }
    launch::BackendOptions bo;
    bo.home = options_.home;
    bo.cohort_bin = options_.cohort_bin;
    bo.workdir = step.workdir;  // a local job runs where a command step of its place would
    auto backend = launch::MakeBackend(backend_name, bo);
    if (!backend.ok()) {
      r.detail = backend.status().message();
      return r;
    }
    std::vector<launch::ArrayElement> elements;
    if (problems.empty()) {
      elements = launch::ExpandArray(js.array, fs::path(step.job_path).parent_path().string(),
                                     &problems);
    }
    if (problems.empty()) (*backend)->Validate(js, elements, &problems);
    if (!problems.empty()) {
      r.detail = fmt::format("job spec {}: {}", step.job_path, problems[0].ToString());
      log << "invalid job spec " << step.job_path << ":\n" << launch::FormatProblems(problems);
      return r;
    }
    auto db = launch::JobDb::Open(launch::JobDbPath(options_.home));
    if (!db.ok()) {
      r.detail = db.status().message();
      return r;
    }
    auto submitted = launch::SubmitJob(**db, **backend, js, elements, options_.home);
    if (!submitted.ok()) {
      r.detail = submitted.status().message();
      return r;
    }
    launch::JobRecord job = *submitted;
    log << fmt::format("submitted job {} ({}) to {} [{}]; logs: {}\n", job.id, job.name,
                       job.backend, job.backend_id, job.log_dir)
        << std::flush;
    // Poll the engine (no event to wait on) with a growing delay; the stop eventfd and the
    // deadline interrupt the wait.
    const double timeout = spec_.steps[i].timeout_s;
    const double deadline = timeout > 0 ? WallSeconds() + timeout : 0;
    Backoff poll(std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
    bool cancel_sent = false;
    std::string why_cancel;
    for (;;) {
      auto s = launch::RefreshJob(**db, **backend, job);
      if (!s.ok()) {
        r.detail = fmt::format("cannot read the state of job {}: {}", job.id,
                               s.status().message());
        if (!cancel_sent) (void)(*backend)->Cancel(job);
        return r;
      }
      if (launch::IsFinalState(s->state)) {
        log << fmt::format("job {}: {}{}\n", job.id, launch::StateName(s->state),
                           s->detail.empty() ? "" : " (" + s->detail + ")");
        if (!why_cancel.empty()) {
          r.state = why_cancel == "cancelled" ? StepState::kCancelled : StepState::kFailed;
          r.detail = why_cancel == "cancelled" ? "stopped: the run was cancelled"
                                               : fmt::format("timed out after {}s (job {} "
                                                             "cancelled)", timeout, job.id);
        } else if (s->state == launch::JobState::kSucceeded) {
          r.state = StepState::kSucceeded;
          r.exit_code = 0;
        } else {
          r.exit_code = s->exit_code.value_or(1);
          r.detail = fmt::format("job {} {}{}", job.id, launch::StateName(s->state),
                                 s->detail.empty() ? "" : ": " + s->detail);
        }
        return r;
      }
      int wait = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(poll.Next()).count());
      if (deadline > 0 && !cancel_sent) {
        wait = std::min<int>(
            wait, std::max<int>(0, static_cast<int>((deadline - WallSeconds()) * 1000)));
      }
      int which = WaitAny({stop_.fd()}, wait);
      if (cancel_sent) continue;
      if (which == 0 || (deadline > 0 && WallSeconds() >= deadline)) {
        why_cancel = which == 0 ? "cancelled" : "timeout";
        Status c = (*backend)->Cancel(job);
        log << fmt::format("cancelling job {} ({}){}\n", job.id, why_cancel,
                           c.ok() ? "" : ": " + c.message());
        cancel_sent = true;
        poll.Reset();
      }
    }
  }

  const PipelineSpec& spec_;
  RunRecord run_;
  std::vector<StepRecord> records_;
  RunDb* db_;
  ExecutorOptions options_;
  std::vector<size_t> order_;
  OutputMap outputs_;
  std::vector<std::thread> threads_;
  // Each command attempt carries its own cookie: what it leaves behind, even outside its
  // process group (setsid), is killed when it ends, and all of it if this process dies.
  const JobSweeper sweeper_;
  int running_ = 0;
  EventFd events_ready_;  // a step thread has queued an event
  EventFd stop_;    // the run is cancelled: step threads stop their processes
  Mutex mu_;
  std::deque<Event> events_ COHORT_GUARDED_BY(mu_);  // step threads -> coordinator
};

uint64_t Fnv1a(const std::string& data, uint64_t h) {
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

Result<ResolvedStep> ResolveStep(const Step& step, const std::string& base_dir,
                                 const std::map<std::string, std::string>& params,
                                 const OutputMap& outputs) {
  auto lookup = [&](const Ref& ref) -> Result<std::string> {
    if (ref.kind == Ref::Kind::kParam) {
      auto it = params.find(ref.param);
      if (it == params.end()) return NotFound("unknown parameter '{}'", ref.param);
      return it->second;
    }
    auto it = outputs.find(ref.step);
    if (it == outputs.end() || !it->second.count(ref.output)) {
      return FailedPrecondition("step '{}' produced no output '{}' (was it skipped?)", ref.step,
                                ref.output);
    }
    return it->second.at(ref.output);
  };
  ResolvedStep r;
  r.backend = step.backend;
  r.output_values = step.output_values;
  for (const auto& a : step.command) {
    COHORT_ASSIGN_OR_RETURN(std::string v, SubstituteTemplates(a, lookup));
    r.argv.push_back(v);
  }
  if (!step.shell.empty()) {
    COHORT_ASSIGN_OR_RETURN(std::string v, SubstituteTemplates(step.shell, lookup));
    r.argv = {"/bin/sh", "-c", v};
  }
  for (const auto& [k, v] : step.env) {
    COHORT_ASSIGN_OR_RETURN(r.env[k], SubstituteTemplates(v, lookup));
  }
  COHORT_ASSIGN_OR_RETURN(std::string workdir, SubstituteTemplates(step.workdir, lookup));
  r.workdir = Absolute(base_dir, workdir.empty() ? "." : workdir);
  for (const auto& in : step.inputs) {
    COHORT_ASSIGN_OR_RETURN(std::string v, SubstituteTemplates(in, lookup));
    r.inputs.push_back(Absolute(r.workdir, v));
  }
  for (const auto& out : step.output_files) {
    COHORT_ASSIGN_OR_RETURN(std::string v, SubstituteTemplates(out, lookup));
    r.output_files.push_back(Absolute(r.workdir, v));
  }
  if (!step.job.empty()) {
    COHORT_ASSIGN_OR_RETURN(std::string path, SubstituteTemplates(step.job, lookup));
    r.job_path = Absolute(base_dir, path);
    auto text = ReadFileToString(r.job_path);
    if (!text.ok()) return NotFound("cannot read the job spec {}", r.job_path);
    COHORT_ASSIGN_OR_RETURN(r.job_text, SubstituteTemplatesInYaml(*text, lookup));
  }
  return r;
}

Result<std::string> CacheKey(const std::string& step_name, const ResolvedStep& step) {
  // Length-prefixed fields, so that no two different steps serialize alike.
  std::string data;
  auto field = [&](const std::string& tag, const std::string& value) {
    data += fmt::format("{}:{}:", tag, value.size());
    data += value;
    data += '\n';
  };
  field("name", step_name);
  for (const auto& a : step.argv) field("arg", a);
  field("job", step.job_text);
  field("backend", step.job_text.empty() ? "" : step.backend);
  field("workdir", step.workdir);
  for (const auto& [k, v] : step.env) field("env", k + "=" + v);
  for (const auto& o : step.output_values) field("output", o);
  for (const auto& o : step.output_files) field("output_file", o);
  for (const auto& in : step.inputs) {
    auto contents = ReadFileToString(in);
    if (!contents.ok() || fs::is_directory(in)) {
      return NotFound("input {} does not exist (or is not a readable file)", in);
    }
    field("input", in);
    field("contents", *contents);
  }
  return fmt::format("{:016x}{:016x}", Fnv1a(data, 14695981039346656037ULL),
                     Fnv1a(data, 0x84222325cbf29ce4ULL ^ data.size()));
}

Result<RunOutcome> ExecuteNew(const PipelineSpec& spec, const std::string& spec_path,
                              const std::string& spec_yaml,
                              const std::map<std::string, std::string>& params,
                              const ExecutorOptions& options) {
  COHORT_ASSIGN_OR_RETURN(auto db, RunDb::Open(RunDbPath(options.home)));
  RunRecord run;
  run.pipeline = spec.name;
  run.spec_path = spec_path;
  run.spec_yaml = spec_yaml;
  run.base_dir = spec.base_dir;
  run.params = params;
  run.started_at = WallSeconds();
  COHORT_ASSIGN_OR_RETURN(run.id, db->InsertRun(run));
  std::vector<StepRecord> records;
  std::vector<Problem> problems;
  std::vector<size_t> order = TopologicalOrder(spec, &problems);
  records.resize(spec.steps.size());
  for (size_t i = 0; i < spec.steps.size(); ++i) records[i].name = spec.steps[i].name;
  for (size_t i : order) COHORT_RETURN_IF_ERROR(db->PutStep(run.id, records[i]));
  if (options.progress) {
    options.progress(fmt::format("pipeline {}: run {} ({} steps; logs in {})", spec.name, run.id,
                                 spec.steps.size(), RunLogDir(options.home, run.id)));
  }
  Execution e(spec, run, records, db.get(), options);
  return e.Run();
}

Result<RunOutcome> Resume(int64_t run_id, const ExecutorOptions& options) {
  COHORT_ASSIGN_OR_RETURN(auto db, RunDb::Open(RunDbPath(options.home)));
  COHORT_ASSIGN_OR_RETURN(RunRecord run, db->GetRun(run_id));
  if (run.state == RunState::kSucceeded) {
    return FailedPrecondition("run {} succeeded; there is nothing to resume", run_id);
  }
  if (run.state == RunState::kRunning) {
    return FailedPrecondition("run {} is still running (or its runner died without recording "
                              "an end; then cancel it first)", run_id);
  }
  std::vector<Problem> problems;
  PipelineSpec spec = ParsePipelineSpec(run.spec_yaml, run.base_dir, &problems);
  if (!problems.empty()) {
    return InvalidArgument("the stored spec of run {} is invalid:\n{}", run_id,
                           launch::FormatProblems(problems));
  }
  COHORT_ASSIGN_OR_RETURN(auto stored, db->Steps(run_id));
  std::vector<StepRecord> records(spec.steps.size());
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    records[i].name = spec.steps[i].name;
    for (const auto& s : stored) {
      if (s.name == spec.steps[i].name) records[i] = s;
    }
    if (!IsDone(records[i].state)) {
      records[i].state = StepState::kPending;
      records[i].detail.clear();
      COHORT_RETURN_IF_ERROR(db->PutStep(run_id, records[i]));
    }
  }
  run.state = RunState::kRunning;
  run.exit_code.reset();
  run.ended_at = 0;
  COHORT_RETURN_IF_ERROR(db->UpdateRun(run));
  if (options.progress) {
    options.progress(fmt::format("pipeline {}: resuming run {}", spec.name, run_id));
  }
  Execution e(spec, run, records, db.get(), options);
  return e.Run();
}

}  // namespace cohort::pipeline
