// The node's worker group: starts the local workers of one attempt (from the warm
// interpreter when there is one), drains their consoles into log files and the merged
// console, notices their exits through pidfds, records the attempt's first failure, and
// stops them (signal, grace period, SIGKILL, sweep of what they left behind).
//
// Thread-safety: none. One thread (the agent's monitor thread) owns a WorkerGroup and every
// descriptor in it; nothing here is shared with another thread.
#pragma once

#include <poll.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/agent/agent.h"
#include "cohort/agent/console_merger.h"
#include "cohort/agent/log_sink.h"
#include "cohort/agent/zygote.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/sweeper.h"
#include "cohort/rendezvous/rendezvous.h"

namespace cohort::agent {

// What one of the monitor loop's pollfds stands for.
struct PollTag {
  enum class Kind { kSignal, kRoundEnded, kChannel, kWorkerExit, kWorkerStdout, kWorkerStderr };
  Kind kind;
  size_t worker = 0;  // index in the group, for the kWorker* kinds
};

// The pollfds to wait on and, index for index, what each stands for.
struct PollSet {
  std::vector<pollfd> fds;
  std::vector<PollTag> tags;
  void Add(int fd, PollTag tag) {
    fds.push_back({fd, POLLIN, 0});
    tags.push_back(tag);
  }
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  Child child;
  bool alive = false;
  ExitStatus status;
  std::unique_ptr<LogSink> out, err;
  std::string error_file;
};

// What a group start needs beyond the spec: the round's place of the workers and the
// node's per-agent resources, written into each worker's environment.
struct GroupStart {
  rendezvous::RendezvousInfo info;
  std::pair<std::string, int> master;  // MASTER_ADDR, MASTER_PORT
  std::string membership_dir;          // empty: live reconfiguration not offered
  std::string membership_secret;
  std::string snapshot_dir;
};

class WorkerGroup {
 public:
  // `on_change`: called after a worker started or exited (the agent republishes its status);
  // `on_line`: every line a worker prints, for the event log (may be empty).
  WorkerGroup(const AgentOptions& options, std::function<void()> on_change,
              std::function<void(int, std::string_view)> on_line);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // The sweeper (a job cookie and a helper that kills what the workers leave) and the warm
  // interpreter, once per agent, before the first start.
  void Prepare(const std::string& runtime_dir);
  const std::string& cookie() const;
  // Spawns every local worker of `start` as the next attempt (its logs under
  // <log_dir>/<run_id>/attempt_<k>/<rank>/); the previous group must have been stopped.
  Status Start(const GroupStart& start);
  // After a worker exited: the group's end once known (a failure, or every worker done).
  enum class End { kFailed, kSucceeded };
  std::optional<End> CheckEnd();
  // The kept workers re-formed in an announced round: healthy again, republished.
  void Reformed();
  // `first_signal` to every live worker's process group, the grace period (draining pipes),
  // then SIGKILL; kills what the workers left outside their groups. The group is then empty.
  void Stop(int first_signal);
  void ForwardSignal(int sig);

  // Adds the workers' pidfds and pipes to `set`.
  void AddPollFds(PollSet& set) const;
  // Handles a readable worker fd; true when that worker exited.
  bool Handle(const PollTag& tag);
  // Reaps the workers that exited without the monitor loop seeing it yet (before a live
  // announcement); true when every worker is alive afterwards.
  bool ReapExited();
  bool AllExited() const;
  // Gives the workers their ranks in a new round (live reconfiguration): offset + local rank;
  // what they printed so far keeps the old rank.
  void Renumber(int offset);
  // How long the monitor loop may sleep before console lines are due (-1: no limit).
  int ConsoleTimeoutMs() const;
  void FlushDueConsoles();

  // The attempt's first failure (a worker that did not exit 0), until the next Start.
  const std::optional<rendezvous::FailureRecord>& failure() const { return failure_; }
  void SetFailure(rendezvous::FailureRecord f) { failure_ = std::move(f); }
  void ClearFailure() { failure_.reset(); }

  // After a failure in a libcohort job: asks the live workers for their flight recorders
  // (SIGUSR1) and reports each local rank's last collective; empty when the workers do not
  // use libcohort.
  std::string CollectFlightRecords(const rendezvous::FailureRecord& failure);

  const std::vector<Worker>& workers() const { return workers_; }
  WorkerState state() const { return state_; }
  int starts() const { return starts_; }
  Zygote* zygote() { return zygote_.get(); }
  void DropZygote() { zygote_.reset(); }

 private:
  Result<Child> SpawnWorker(const SpawnOptions& so);
  Status SpawnOne(const GroupStart& start, int attempt, int local);
  void MakeConsoles();
  void OnWorkerExit(Worker& w);
  void CloseWorkerPipes(Worker& w);
  void PublishWorker(const Worker& w);
  void StartZygote();
  int OmpThreadsForWorkers() const;
  std::string FlightRecordDir(int rank) const;

  const AgentOptions& o_;
  std::function<void()> on_change_;
  std::function<void(int, std::string_view)> on_line_;
  std::vector<Worker> workers_;
  std::optional<rendezvous::FailureRecord> failure_;
  WorkerState state_ = WorkerState::kInit;
  int starts_ = 0;
  std::string attempt_dir_;
  std::unique_ptr<ConsoleMerger> out_console_, err_console_;
  std::unique_ptr<JobSweeper> sweeper_;  // kills what the workers leave behind
  std::unique_ptr<Zygote> zygote_;       // the warm interpreter, while it serves
  bool subreaper_ = false;               // set by the zygote's start; stays for our lifetime
};

}  // namespace cohort::agent
