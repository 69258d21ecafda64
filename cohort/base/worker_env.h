// The worker environment: the whole contract between the agent that starts a worker and
// the worker itself. It names every variable the agent gives a worker, torchrun's (RANK,
// WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_*, ...) and cohort's own (how to reach the job's
// store, the log and metrics directories), with one writer and one reader:
//
//   agent side:  env = WriteWorkerEnv(w);            // name=value pairs for the child
//   worker side: Result<WorkerEnv> w = ReadWorkerEnv();
//
// ReadWorkerEnv() returns kNotFound when the program was not started by a launcher (no
// RANK and no WORLD_SIZE), kInvalidArgument naming the variable when one is malformed or
// missing, and otherwise the typed contents. A worker with world_size > 1 must join its
// job: JobStoreMissing() says what is missing when it cannot (never train alone silently).
// No other file reads these variables with getenv; programs use the constants below.
//
// Thread-safety: pure functions over the process environment; ReadWorkerEnv() may run on
// any thread while nothing modifies the environment.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/base/exit_codes.h"  // kExitCannotJoinJob: a worker that could not join
#include "cohort/base/status.h"

namespace cohort {

namespace worker_env {
// torchrun's variables, same names and meaning.
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kGroupRank[] = "GROUP_RANK";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";
// cohort's: how libcohort reaches the job's store (an embedded/standalone cohort store, or
// etcd), the round's key prefix, the attempt, where to listen and where to write.
inline constexpr char kToken[] = "COHORT_TOKEN";
inline constexpr char kStoreAddr[] = "COHORT_STORE_ADDR";
inline constexpr char kStorePort[] = "COHORT_STORE_PORT";
inline constexpr char kStorePrefix[] = "COHORT_STORE_PREFIX";
inline constexpr char kEtcdEndpoints[] = "COHORT_ETCD_ENDPOINTS";
inline constexpr char kEtcdPrefix[] = "COHORT_ETCD_PREFIX";
inline constexpr char kEtcdCaCert[] = "COHORT_ETCD_CACERT";
inline constexpr char kEtcdCert[] = "COHORT_ETCD_CERT";
inline constexpr char kEtcdKey[] = "COHORT_ETCD_KEY";
inline constexpr char kEtcdUser[] = "COHORT_ETCD_USER";
// Never written by the agent (it stays out of command lines and spawn records); a worker
// inherits it from the launcher's own environment.
inline constexpr char kEtcdPassword[] = "COHORT_ETCD_PASSWORD";
inline constexpr char kEtcdRequestTimeout[] = "COHORT_ETCD_REQUEST_TIMEOUT";
inline constexpr char kCohortRunId[] = "COHORT_RUN_ID";
inline constexpr char kAttempt[] = "COHORT_ATTEMPT";
inline constexpr char kRound[] = "COHORT_ROUND";
// Random per agent; inherited by every descendant of a worker, so the agent (and its
// sweeper, after the agent's own death) can find what the job started (agent/sweeper.h).
inline constexpr char kJobCookie[] = "COHORT_JOB_COOKIE";
inline constexpr char kListenAddr[] = "COHORT_LISTEN_ADDR";
inline constexpr char kFlightRecorderDir[] = "COHORT_FLIGHT_RECORDER_DIR";
inline constexpr char kMetricsDir[] = "COHORT_METRICS_DIR";
// The membership channel's directory (base/membership_channel.h): set when the agent can
// keep this worker through a membership change (live reconfiguration).
inline constexpr char kMembershipDir[] = "COHORT_MEMBERSHIP_DIR";
// The secret that the channel's steering messages carry (random per agent, inherited only
// by its workers): a file in the directory without it is refused.
inline constexpr char kMembershipSecret[] = "COHORT_MEMBERSHIP_SECRET";
inline constexpr char kMetricsHistory[] = "COHORT_METRICS_HISTORY_S";
// The node's snapshot directory (train/snapshot_store.h): shared memory the agent owns
// (0700, removed with the agent however it ends), where workers publish their newest
// in-memory checkpoint so that it outlives a crashed worker.
inline constexpr char kSnapshotDir[] = "COHORT_SNAPSHOT_DIR";

// The value the launcher process itself was given (e.g. COHORT_TOKEN set by the user
// before `cohort run`); nullopt when unset or empty.
std::optional<std::string> Inherited(const char* name);
}  // namespace worker_env

// How a worker reaches its job's store.
struct JobStoreAccess {
  enum class Kind { kNone, kTcp, kEtcd };
  Kind kind = Kind::kNone;
  // kTcp: a cohort store (embedded in an agent, or `cohort store`).
  std::string addr;
  int port = 0;
  std::string token;
  // kEtcd: the job's keys live under /cohort/<etcd_prefix>/.
  std::vector<std::string> etcd_endpoints;
  std::string etcd_prefix;
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file, etcd_user;
  std::string etcd_password;            // read only; never written (see kEtcdPassword)
  double etcd_request_timeout_s = 0;    // 0: the client's default
  // Key prefix of the current round inside the job's store (both kinds).
  std::string round_prefix;
};

struct WorkerEnv {
  // torchrun's contract.
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  int role_rank = 0;
  int role_world_size = 1;
  std::string role_name = "default";
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  std::string error_file;
  // TORCHELASTIC_USE_AGENT_STORE: the agent serves torch's TCPStore at MASTER_ADDR:PORT.
  bool agent_store = false;
  // Written when more than one worker shares the node and the launcher's own environment
  // has no OMP_NUM_THREADS (as torchrun); 0 = not set.
  int omp_num_threads = 0;
  // cohort's.
  JobStoreAccess store;
  int attempt = 0;                  // this agent's worker-group start, from 0
  int round = 0;                    // the job-wide rendezvous round these ranks formed
  std::string job_cookie;           // marks the job's processes (agent/sweeper.h)
  std::string listen_addr;          // address this node's peers reach its workers at
  std::string flight_recorder_dir;  // where a collective's flight record is dumped
  std::string metrics_dir;          // where the worker exports rank<R>.json for the agent
  std::string membership_dir;       // live reconfiguration channel; empty: not offered
  std::string membership_secret;    // what the channel's messages carry (its authentication)
  std::string snapshot_dir;         // the node's snapshot directory; empty: none
  double metrics_history_s = 0;     // 0: the exporter's default
};

// name=value pairs for a worker's environment (only the fields that are set).
std::vector<std::pair<std::string, std::string>> WriteWorkerEnv(const WorkerEnv& env);

// Every variable of the contract: those only the agent sets (the launcher's own copies are
// dropped), and those that pass through from the user unless the agent sets them.
const std::vector<std::string>& AgentOwnedVariables();
const std::vector<std::string>& PassThroughVariables();

// A worker's whole environment: the launcher's own, without any job variables it may have
// inherited (a stale COHORT_STORE_PORT must not point an etcd job's workers elsewhere),
// plus `extra`, plus WriteWorkerEnv(env). OMP_NUM_THREADS, COHORT_ETCD_PASSWORD and the
// metrics variables pass through from the launcher unless `env` sets them.
std::vector<std::string> WorkerEnvironment(
    const WorkerEnv& env, const std::vector<std::pair<std::string, std::string>>& extra = {});

// Reads the contract from this process's environment (see the file comment for errors).
Result<WorkerEnv> ReadWorkerEnv();

// Empty when `env` can join its job (world size 1 needs no store); otherwise one sentence
// naming what is missing and what to do.
std::string JobStoreMissing(const WorkerEnv& env);

// OMP_NUM_THREADS as the worker sees it (torch's intra-op threads); 0 when unset.
int OmpThreadsOfThisProcess();

// The variables a worker kept through live reconfiguration sets in its own environment when
// it re-forms in the round of `notice` (its new place, the round's store and MASTER_*), so
// that code reading RANK and friends, and a newcomer's env://, see the new round.
struct MembershipNotice;
std::vector<std::pair<std::string, std::string>> ReformedEnvironment(
    const MembershipNotice& notice);

namespace worker_env {
// The names a Python worker reads, keyed by what they mean ("rank" -> "RANK"): the table
// cohort_torch._C.WORKER_ENV exposes, so the Python side spells no variable itself.
const std::vector<std::pair<const char*, const char*>>& PythonNames();
}  // namespace worker_env

}  // namespace cohort
