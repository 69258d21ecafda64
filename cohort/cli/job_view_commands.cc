// `cohort status | list | logs | cancel`: the commands on jobs already submitted (see
// job_commands.h); also JobJson and WaitForEnd, which submit uses (job_commands_internal.h).
// Thread-safety: main thread only.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cohort/base/backoff.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/time.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/job_commands.h"
#include "cohort/cli/job_commands_internal.h"
#include "cohort/launch/backend.h"
#include "cohort/launch/job_db.h"
#include "cohort/launch/submit.h"
#include "cohort/launch/targets.h"

namespace cohort::cli {
namespace {

using json = nlohmann::json;
using launch::JobDb;
using launch::JobRecord;
using launch::JobState;
using launch::JobStatus;

Result<JobStatus> Refresh(JobDb& db, JobRecord& job, const launch::BackendOptions& options) {
  COHORT_ASSIGN_OR_RETURN(auto backend, launch::MakeBackendForJob(job, options));
  return launch::RefreshJob(db, *backend, job);
}

// A job of the history, found by id or name, and (when asked) the backend that runs it.
struct OpenedJob {
  std::unique_ptr<JobDb> db;
  JobRecord job;
  std::unique_ptr<launch::Backend> backend;
};

// -1 to go on with `out` filled, else the exit code (the error printed for `command`).
int OpenJob(const JobCommandFlags& c, const std::string& id, const char* command,
            bool with_backend, OpenedJob* out) {
  auto db = OpenJobDb(c);
  if (!db.ok()) return CommandFailed(command, db.status(), kExitBackend);
  auto job = (*db)->Find(id);
  if (!job.ok()) return CommandFailed(command, job.status(), kExitNoSuchJob);
  out->db = std::move(*db);
  out->job = std::move(*job);
  if (!with_backend) return -1;
  auto backend = launch::MakeBackendForJob(out->job, c.Options());
  if (!backend.ok()) return CommandFailed(command, backend.status(), kExitBackend);
  out->backend = std::move(*backend);
  return -1;
}

void PrintStatus(const JobRecord& j, const JobStatus& s) {
  std::string exit = j.exit_code ? fmt::format(", exit {}", *j.exit_code) : "";
  fmt::print("job {} {} ({}): {}{}\n", j.id, j.name, j.backend, launch::StateName(j.state),
             exit);
  fmt::print("  submitted {}", FormatTime(j.submitted_at));
  if (j.started_at > 0) fmt::print(", started {}", FormatTime(j.started_at));
  if (j.ended_at > 0) fmt::print(", ended {}", FormatTime(j.ended_at));
  fmt::print("\n");
  if (j.backend == launch::kTargetsBackend) {
    if (!j.backend_id.empty()) fmt::print("  one job per target: {}\n", j.backend_id);
  } else if (!j.backend_id.empty()) {
    fmt::print("  {} id: {}\n", j.backend, j.backend_id);
  }
  if (!j.log_dir.empty()) fmt::print("  logs: {}\n", j.log_dir);
  if (!j.detail.empty()) fmt::print("  detail: {}\n", j.detail);
  if (s.elements.empty()) return;
  fmt::print("  elements: {} ({})\n", s.elements.size(),
             launch::CountElementStates(s.elements));
  const bool targets = std::any_of(s.elements.begin(), s.elements.end(),
                                   [](const launch::ElementRecord& e) { return !e.target.empty(); });
  size_t width = 6;
  for (const auto& e : s.elements) width = std::max(width, e.target.size());
  auto row = [&](const std::string& index, const std::string& target, const std::string& state,
                 const std::string& exit, const std::string& detail) {
    fmt::print("  {:>6}  {}{:<10} {:>5}  {}\n", index,
               targets ? fmt::format("{:<{}}  ", target, width) : "", state, exit, detail);
  };
  row("INDEX", "TARGET", "STATE", "EXIT", "DETAIL");
  for (const auto& e : s.elements) {
    row(std::to_string(e.index), e.target, std::string(launch::StateName(e.state)),
        e.exit_code ? std::to_string(*e.exit_code) : "-", e.detail);
  }
}

int JobExitCode(JobState state) {
  if (state == JobState::kSucceeded) return kExitOk;
  if (state == JobState::kCancelled) return kExitJobCancelled;
  return kExitWorkerFailed;
}

}  // namespace

json JobJson(const JobRecord& j, const JobStatus* s) {
  json out = {{"id", j.id},           {"name", j.name},
              {"backend", j.backend}, {"state", launch::StateName(j.state)},
              {"submitted_at", j.submitted_at}, {"started_at", j.started_at},
              {"ended_at", j.ended_at}, {"log_dir", j.log_dir},
              {"backend_id", j.backend_id}, {"array_size", j.array_size},
              {"detail", j.detail}};
  out["exit_code"] = j.exit_code ? json(*j.exit_code) : json(nullptr);
  if (s) {
    json elements = json::array();
    for (const auto& e : s->elements) {
      elements.push_back({{"index", e.index},
                          {"target", e.target},
                          {"state", launch::StateName(e.state)},
                          {"exit_code", e.exit_code ? json(*e.exit_code) : json(nullptr)},
                          {"log_dir", e.log_dir},
                          {"detail", e.detail}});
    }
    out["elements"] = elements;
  }
  return out;
}

// Polls until the job reaches a final state; prints each new state once.
int WaitForEnd(JobDb& db, JobRecord& job, const launch::BackendOptions& options, bool quiet) {
  auto backend = launch::MakeBackendForJob(job, options);
  if (!backend.ok()) {
    fmt::print(stderr, "cohort: {}\n", backend.status().message());
    return kExitBackend;
  }
  JobState last = JobState::kUnknown;
  // Polling an external engine: no event to wait on.
  Backoff poll(std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
  for (;;) {
    auto s = launch::RefreshJob(db, **backend, job);
    if (!s.ok()) {
      fmt::print(stderr, "cohort: cannot read the state of job {}: {}\n", job.id,
                 s.status().message());
      return kExitBackend;
    }
    if (s->state != last && !quiet) {
      fmt::print("job {}: {}\n", job.id, launch::StateName(s->state));
      std::fflush(stdout);
      last = s->state;
    }
    if (launch::IsFinalState(s->state)) {
      if (!quiet) PrintStatus(job, *s);
      return JobExitCode(s->state);
    }
    poll.Sleep();
  }
}

int StatusCommand(const std::vector<std::string>& args) {
  CLI::App app("Show a job's state (and its array elements).", "cohort status");
  JobCommandFlags c;
  c.Add(app);
  std::string id;
  bool wait = false;
  app.add_option("job", id, "job id or name (default: list recent jobs)");
  app.add_flag("--wait", wait, "wait until the job ends");
  if (int rc = ParseCommandLine(app, args, "status"); rc >= 0) return rc;
  if (id.empty()) return ListCommand(args);
  OpenedJob o;
  if (int rc = OpenJob(c, id, "status", /*with_backend=*/false, &o); rc >= 0) return rc;
  JobRecord& job = o.job;
  if (wait) return WaitForEnd(*o.db, job, c.Options(), c.json);
  auto s = Refresh(*o.db, job, c.Options());
  if (!s.ok()) {
    fmt::print(stderr, "cohort status: job {}: {}\n", job.id, s.status().message());
    return kExitBackend;
  }
  if (c.json) {
    fmt::print("{}\n", JobJson(job, &*s).dump(1));
  } else {
    PrintStatus(job, *s);
  }
  return kExitOk;
}

int ListCommand(const std::vector<std::string>& args) {
  CLI::App app("List recent jobs.", "cohort list");
  JobCommandFlags c;
  c.Add(app);
  int limit = 50;
  std::string ignored;
  app.add_option("--limit", limit, "how many (newest first)");
  app.add_option("job", ignored)->group("");  // `cohort status` without a job comes here
  app.allow_extras();
  if (int rc = ParseCommandLine(app, args, "list"); rc >= 0) return rc;
  auto db = OpenJobDb(c);
  if (!db.ok()) return CommandFailed("list", db.status(), kExitBackend);
  auto jobs = (*db)->List(limit);
  if (!jobs.ok()) return CommandFailed("list", jobs.status(), kExitBackend);
  json out = json::array();
  if (!c.json) {
    fmt::print("{:>5}  {:<24} {:<11} {:<10} {:>5} {:>9}  {}\n", "ID", "NAME", "BACKEND", "STATE",
               "EXIT", "ELEMENTS", "SUBMITTED");
  }
  for (auto& j : *jobs) {
    if (!launch::IsFinalState(j.state)) (void)Refresh(**db, j, c.Options());
    if (c.json) {
      out.push_back(JobJson(j, nullptr));
      continue;
    }
    fmt::print("{:>5}  {:<24} {:<11} {:<10} {:>5} {:>9}  {}\n", j.id, j.name, j.backend,
               launch::StateName(j.state),
               j.exit_code ? std::to_string(*j.exit_code) : "-",
               j.array_size ? std::to_string(j.array_size) : "-", FormatTime(j.submitted_at));
  }
  if (c.json) fmt::print("{}\n", out.dump(1));
  return kExitOk;
}

int LogsCommand(const std::vector<std::string>& args) {
  CLI::App app("Print a job's log.", "cohort logs");
  JobCommandFlags c;
  c.Add(app);
  std::string id;
  int element = -1, rank = -1;
  bool follow = false;
  app.add_option("job", id, "job id or name")->required();
  app.add_option("--element", element, "array element");
  app.add_option("--rank", rank, "one worker's log (default: the whole console)");
  app.add_flag("-f,--follow", follow, "keep printing until the job ends");
  if (int rc = ParseCommandLine(app, args, "logs"); rc >= 0) return rc;
  OpenedJob o;
  if (int rc = OpenJob(c, id, "logs", /*with_backend=*/true, &o); rc >= 0) return rc;
  if (launch::NeverSubmitted(o.job)) {  // the engine knows nothing of it: no logs anywhere
    fmt::print(stderr, "cohort logs: job {} has no logs: it was never submitted ({})\n",
               o.job.id, o.job.detail);
    return kExitNoSuchJob;
  }
  std::ifstream in;
  std::string path;
  Backoff poll(std::chrono::milliseconds(100), std::chrono::milliseconds(500));
  for (;;) {
    if (!in.is_open()) {
      auto p = o.backend->LogPath(o.job, element, rank);
      if (!p.ok() && (!follow || p.status().code() != StatusCode::kNotFound)) {
        fmt::print(stderr, "cohort logs: {}\n", p.status().message());
        return ExitCodeFor(p.status(), ExitContext::kJobCommand, kExitNoSuchJob);
      }
      if (p.ok()) {
        path = *p;
        in.open(path);
        if (!in && !follow) {
          fmt::print(stderr, "cohort logs: no log at {} (yet)\n", path);
          return kExitNoSuchJob;
        }
      }
    }
    std::string line;
    while (in.is_open() && std::getline(in, line)) {
      if (in.eof()) {  // a partial last line: print it when it is complete
        in.clear();
        in.seekg(-static_cast<std::streamoff>(line.size()), std::ios::cur);
        break;
      }
      fmt::print("{}\n", line);
    }
    in.clear();
    std::fflush(stdout);
    if (!follow) return kExitOk;
    auto s = launch::RefreshJob(*o.db, *o.backend, o.job);
    if (s.ok() && launch::IsFinalState(s->state)) {
      // One more pass for what the job wrote before it ended.
      while (in.is_open() && std::getline(in, line)) fmt::print("{}\n", line);
      return kExitOk;
    }
    poll.Sleep();  // following a file: poll like tail -f
  }
}

namespace {

const launch::ElementRecord* FindElement(const JobStatus& s, int index) {
  for (const auto& e : s.elements) {
    if (e.index == index) return &e;
  }
  return nullptr;
}

// After a cancel: polls the backend (no event to wait on) until the job, or its element
// `element` (>= 0), reaches a final state or `timeout` passes. Whether it ended, and the
// last state seen (unknown when it could not be read).
std::pair<bool, JobState> PollUntilEnded(OpenedJob& o, int element, double timeout) {
  Backoff poll(std::chrono::milliseconds(50), std::chrono::milliseconds(500),
               Deadline::After(std::chrono::duration_cast<Duration>(
                   std::chrono::duration<double>(timeout))));
  for (;;) {
    auto s = launch::RefreshJob(*o.db, *o.backend, o.job);
    const launch::ElementRecord* e = s.ok() && element >= 0 ? FindElement(*s, element) : nullptr;
    const JobState state = !s.ok()        ? JobState::kUnknown
                           : element < 0    ? s->state
                           : e != nullptr   ? e->state
                                            : JobState::kUnknown;
    if (launch::IsFinalState(state)) return {true, state};
    if (!poll.Sleep()) return {false, state};
  }
}

// `cohort cancel JOB --element I`: stops one element, waits (until `timeout`) for it to end.
int CancelOneElement(OpenedJob& o, int element, double timeout) {
  JobRecord& job = o.job;
  if (job.array_size == 0) {
    fmt::print(stderr, "cohort cancel: job {} is not an array; leave out --element\n", job.id);
    return kExitUsage;
  }
  if (element >= job.array_size) {
    fmt::print(stderr, "cohort cancel: job {} has elements 0..{}, not {}\n", job.id,
               job.array_size - 1, element);
    return kExitInvalidValue;
  }
  auto before = launch::RefreshJob(*o.db, *o.backend, job);
  const launch::ElementRecord* e = before.ok() ? FindElement(*before, element) : nullptr;
  if (e != nullptr && launch::IsFinalState(e->state)) {
    fmt::print(stderr, "cohort cancel: element {} of job {} already ended ({})\n", element,
               job.id, launch::StateName(e->state));
    return kExitInvalidValue;
  }
  if (Status s = o.backend->CancelElement(job, element); !s.ok()) {
    fmt::print(stderr, "cohort cancel: job {} element {}: {}\n", job.id, element, s.message());
    return ExitCodeFor(s, ExitContext::kJobCommand, kExitBackend);
  }
  const auto [ended, state] = PollUntilEnded(o, element, timeout);
  if (!ended) {
    fmt::print(stderr, "cohort cancel: element {} of job {} asked to stop; still {} after {} s\n",
               element, job.id, launch::StateName(state), timeout);
    return kExitBackend;
  }
  fmt::print("job {} element {}: {}\n", job.id, element, launch::StateName(state));
  return kExitOk;
}

}  // namespace

int CancelCommand(const std::vector<std::string>& args) {
  CLI::App app("Cancel a job, or one element of an array job.", "cohort cancel");
  JobCommandFlags c;
  c.Add(app);
  std::string id;
  double timeout = 60;
  int element = -1;
  app.add_option("job", id, "job id or name")->required();
  app.add_option("--element", element, "stop only this element of an array (the others go on)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--timeout", timeout, "seconds to wait for the job to stop");
  if (int rc = ParseCommandLine(app, args, "cancel"); rc >= 0) return rc;
  OpenedJob o;
  if (int rc = OpenJob(c, id, "cancel", /*with_backend=*/true, &o); rc >= 0) return rc;
  if (element >= 0) return CancelOneElement(o, element, timeout);
  JobRecord& job = o.job;
  auto before = launch::RefreshJob(*o.db, *o.backend, job);
  if (before.ok() && launch::IsFinalState(before->state)) {
    fmt::print(stderr, "cohort cancel: job {} already ended ({})\n", job.id,
               launch::StateName(before->state));
    return kExitInvalidValue;
  }
  if (Status s = o.backend->Cancel(job); !s.ok()) {
    fmt::print(stderr, "cohort cancel: job {}: {}\n", job.id, s.message());
    return kExitBackend;
  }
  const auto [ended, state] = PollUntilEnded(o, -1, timeout);
  if (!ended) {
    fmt::print(stderr, "cohort cancel: job {} asked to stop; still {} after {} s\n", job.id,
               launch::StateName(state), timeout);
    return kExitBackend;
  }
  fmt::print("job {}: {}\n", job.id, launch::StateName(state));
  return kExitOk;
}

}  // namespace cohort::cli
