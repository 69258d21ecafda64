// The elastic agent: one per node. It joins a rendezvous round, spawns the node's workers
// with the torchrun environment, watches them (exits are noticed through pidfds at once),
// and on a failure stops the group (SIGTERM, grace period, SIGKILL), ends the round and
// rejoins while the job-wide restart budget lasts. Membership changes from other nodes end
// the round without spending the budget; workers that declared they re-form in place are
// kept through them and told their new rank (live reconfiguration: the membership channel,
// base/membership_channel.h; docs/multinode.md). Signals to the agent are forwarded to the
// workers.
//
// Threads: Run() executes on the calling thread (the "monitor" thread), which owns every
// worker, pipe, log sink and the membership channel. For multi-node rounds a "rdzv-watch"
// thread (started before the workers) sends heartbeats
// and waits for the round to end on its own store connection; it reports through an
// eventfd. Call BlockAgentSignals() at the start of main(), before any thread exists.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cohort/base/exit_codes.h"
#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/metrics/agent_status.h"
#include "cohort/metrics/registry.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/store.h"

namespace cohort::agent {

using metrics::WorkerState;
using metrics::WorkerStateName;

// Which of a worker's streams go to files only (redirect) or to console and files (tee).
// Bit 1 = stdout, bit 2 = stderr, as torchrun's --redirects/--tee.
struct StreamPolicy {
  int all = 0;
  std::map<int, int> per_local_rank;
  int For(int local_rank) const {
    auto it = per_local_rank.find(local_rank);
    return it == per_local_rank.end() ? all : it->second;
  }
};

struct WorkerSpec {
  std::vector<std::string> argv;  // the worker command line
  int nproc_per_node = 1;
  std::string role = "default";
  int max_restarts = 0;
  std::string run_id = "none";
  std::string log_dir;  // attempt logs under <log_dir>/<run_id>/attempt_<k>/<rank>/
  StreamPolicy redirects;
  StreamPolicy tee;
  std::set<int> local_ranks_filter;  // empty = every rank on the console
  std::string master_addr;           // empty = rank-0 node's address
  int master_port = 0;               // 0 = reserve a free port for the job
  Duration stop_grace = std::chrono::seconds(5);
  // Identical console lines from several local ranks within this window print once as
  // "[ranks 0-3]: ..." (0: every rank's line separately). Log files are never merged.
  Duration log_merge_window = std::chrono::milliseconds(100);
  // How the workers reach the job's store (their communicator's rendezvous) and the
  // address their peers reach them at: passed on through the worker environment.
  JobStoreAccess store_access;
  std::string listen_addr;
  // Where workers dump flight records (the user's COHORT_FLIGHT_RECORDER_DIR); empty: each
  // rank's log directory of the attempt.
  std::string flight_recorder_dir;
  // Said with a failed job's summary, e.g. which interpreter ran a .py entrypoint.
  std::string entrypoint_note;
  // A Python entrypoint (`argv` is the interpreter, its options, the script or `-m module`,
  // and the program's arguments): the workers are forked from a warm interpreter that has
  // imported `preload` (zygote.h). program_at 0: every worker starts fresh.
  struct WarmStart {
    size_t program_at = 0;              // index in argv of the script (or module)
    bool module = false;                // -m: argv[program_at] is a module, after "-m"
    std::vector<std::string> preload;   // modules imported before the workers start
    std::string zygote_script;          // cohort_zygote.py
  } warm;
  // Further variables for every worker (tests); the worker contract wins on a clash.
  std::vector<std::pair<std::string, std::string>> extra_env;
};

// Open files the agent holds per running worker: its pidfd, the read ends of its stdout and
// stderr pipes, and its two log files.
inline constexpr int kDescriptorsPerWorker = 5;

struct AgentOptions {
  WorkerSpec spec;
  rendezvous::RendezvousConfig rdzv;
  rendezvous::NodeInfo self;
  // Opens a new connection to the job's store (the agent's own, and the watcher's).
  std::function<Result<std::shared_ptr<store::Store>>()> connect_store;
  // This node serves the job's store: after its workers succeed it keeps running until the
  // job is over, so the other nodes keep their store.
  bool serves_store = false;
  // Monitoring, all optional: workers export their metrics to `metrics_dir`
  // (COHORT_METRICS_DIR); the agent publishes its state to `status`, and rounds, restarts,
  // failures and worker log lines to `events` (the dashboard reads both).
  std::string metrics_dir;
  metrics::StatusBoard* status = nullptr;
  metrics::EventLog* events = nullptr;
  // Where other hosts reach this agent's metrics endpoint ("http://addr:port/"; empty:
  // none): published in the job's directory (job_directory.h) once the agent has joined,
  // with an end record when it stops, so that any agent's /job page shows the whole job.
  std::string metrics_url;
};

struct AgentResult {
  int exit_code = 0;
  std::string summary;  // one paragraph for the user; empty on success
};

// Blocks the signals the agent handles (INT, TERM, HUP, USR1, USR2) in the calling thread
// and every thread it creates later; ignores SIGPIPE.
void BlockAgentSignals();

class Agent {
 public:
  explicit Agent(AgentOptions options);
  ~Agent();
  AgentResult Run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::agent
