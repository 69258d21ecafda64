// Implements the worker environment contract (worker_env.h).
// Thread-safety: pure functions over the process environment.
#include "cohort/base/worker_env.h"

#include "cohort/base/membership_channel.h"

#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"

namespace cohort {
namespace {

namespace we = worker_env;

std::string Get(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// An integer variable: absent -> fallback; present but malformed -> error naming it.
Status ReadInt(const char* name, int* out, int min_value) {
  std::string raw = Get(name);
  if (raw.empty()) return Status::Ok();
  auto v = ParseInt64(raw);
  if (!v || *v < min_value || *v > (1ll << 31) - 1) {
    return InvalidArgument("{}={} is not an integer >= {}", name, raw, min_value);
  }
  *out = static_cast<int>(*v);
  return Status::Ok();
}

Status ReadSeconds(const char* name, double* out) {
  std::string raw = Get(name);
  if (raw.empty()) return Status::Ok();
  auto v = ParseDouble(raw);
  if (!v || *v < 0) return InvalidArgument("{}={} is not a number of seconds", name, raw);
  *out = *v;
  return Status::Ok();
}

}  // namespace

std::optional<std::string> worker_env::Inherited(const char* name) {
  std::string v = Get(name);
  if (v.empty()) return std::nullopt;
  return v;
}

std::vector<std::pair<std::string, std::string>> WriteWorkerEnv(const WorkerEnv& w) {
  std::vector<std::pair<std::string, std::string>> env = {
      {we::kRank, std::to_string(w.rank)},
      {we::kLocalRank, std::to_string(w.local_rank)},
      {we::kWorldSize, std::to_string(w.world_size)},
      {we::kLocalWorldSize, std::to_string(w.local_world_size)},
      {we::kGroupRank, std::to_string(w.group_rank)},
      {we::kGroupWorldSize, std::to_string(w.group_world_size)},
      {we::kRoleRank, std::to_string(w.role_rank)},
      {we::kRoleWorldSize, std::to_string(w.role_world_size)},
      {we::kRoleName, w.role_name},
      {we::kMasterAddr, w.master_addr},
      {we::kMasterPort, std::to_string(w.master_port)},
      {we::kRestartCount, std::to_string(w.restart_count)},
      {we::kMaxRestarts, std::to_string(w.max_restarts)},
      {we::kRunId, w.run_id},
      {we::kErrorFile, w.error_file},
      {we::kUseAgentStore, w.agent_store ? "True" : "False"},
      {we::kAttempt, std::to_string(w.attempt)},
      {we::kRound, std::to_string(w.round)},
      {we::kCohortRunId, w.run_id},
  };
  // Only what is set: an empty text or a number <= 0 is left out.
  auto add = [&env](const char* name, const std::string& value) {
    if (!value.empty()) env.emplace_back(name, value);
  };
  auto add_positive = [&env](const char* name, auto value) {
    if (value > 0) env.emplace_back(name, fmt::format("{}", value));
  };
  add_positive(we::kOmpNumThreads, w.omp_num_threads);
  const JobStoreAccess& s = w.store;
  add(we::kStorePrefix, s.round_prefix);
  if (s.kind == JobStoreAccess::Kind::kTcp) {
    add(we::kStoreAddr, s.addr);
    env.emplace_back(we::kStorePort, std::to_string(s.port));
    add(we::kToken, s.token);
  } else if (s.kind == JobStoreAccess::Kind::kEtcd) {
    std::string endpoints;
    for (const auto& e : s.etcd_endpoints) endpoints += (endpoints.empty() ? "" : ",") + e;
    add(we::kEtcdEndpoints, endpoints);
    add(we::kEtcdPrefix, s.etcd_prefix);
    add(we::kEtcdCaCert, s.etcd_ca_file);
    add(we::kEtcdCert, s.etcd_cert_file);
    add(we::kEtcdKey, s.etcd_key_file);
    add(we::kEtcdUser, s.etcd_user);
    add_positive(we::kEtcdRequestTimeout, s.etcd_request_timeout_s);
  }
  add(we::kListenAddr, w.listen_addr);
  add(we::kJobCookie, w.job_cookie);
  add(we::kFlightRecorderDir, w.flight_recorder_dir);
  add(we::kMetricsDir, w.metrics_dir);
  add(we::kMembershipDir, w.membership_dir);
  add(we::kMembershipSecret, w.membership_secret);
  add(we::kSnapshotDir, w.snapshot_dir);
  add_positive(we::kMetricsHistory, w.metrics_history_s);
  return env;
}

const std::vector<std::string>& AgentOwnedVariables() {
  static const std::vector<std::string> kNames = {
      we::kRank, we::kLocalRank, we::kWorldSize, we::kLocalWorldSize, we::kGroupRank,
      we::kGroupWorldSize, we::kRoleRank, we::kRoleWorldSize, we::kRoleName, we::kMasterAddr,
      we::kMasterPort, we::kRestartCount, we::kMaxRestarts, we::kRunId, we::kErrorFile,
      we::kUseAgentStore, we::kToken, we::kStoreAddr, we::kStorePort, we::kStorePrefix,
      we::kEtcdEndpoints, we::kEtcdPrefix, we::kEtcdCaCert, we::kEtcdCert, we::kEtcdKey,
      we::kEtcdUser, we::kEtcdRequestTimeout, we::kCohortRunId, we::kAttempt, we::kRound,
      we::kJobCookie, we::kListenAddr, we::kFlightRecorderDir, we::kMembershipDir,
      we::kMembershipSecret, we::kSnapshotDir};
  return kNames;
}

const std::vector<std::string>& PassThroughVariables() {
  static const std::vector<std::string> kNames = {we::kOmpNumThreads, we::kEtcdPassword,
                                                  we::kMetricsDir, we::kMetricsHistory};
  return kNames;
}

std::vector<std::string> WorkerEnvironment(
    const WorkerEnv& env, const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::pair<std::string, std::string>> overrides = extra;
  for (auto& kv : WriteWorkerEnv(env)) overrides.push_back(std::move(kv));
  return MergeEnvironment(overrides, AgentOwnedVariables());
}

Result<WorkerEnv> ReadWorkerEnv() {
  WorkerEnv w;
  const bool has_rank = !Get(we::kRank).empty(), has_world = !Get(we::kWorldSize).empty();
  if (!has_rank && !has_world) {
    return NotFound("not started by a launcher: {} and {} are not set", we::kRank,
                    we::kWorldSize);
  }
  if (!has_rank || !has_world) {
    return InvalidArgument("{} is set but {} is not; start this program with `cohort run`",
                           has_rank ? we::kRank : we::kWorldSize,
                           has_rank ? we::kWorldSize : we::kRank);
  }
  COHORT_RETURN_IF_ERROR(ReadInt(we::kWorldSize, &w.world_size, 1));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kRank, &w.rank, 0));
  if (w.rank >= w.world_size) {
    return InvalidArgument("{}={} is not a rank of {}={}", we::kRank, w.rank, we::kWorldSize,
                           w.world_size);
  }
  w.local_rank = w.rank;
  w.local_world_size = w.world_size;
  COHORT_RETURN_IF_ERROR(ReadInt(we::kLocalRank, &w.local_rank, 0));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kLocalWorldSize, &w.local_world_size, 1));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kGroupRank, &w.group_rank, 0));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kGroupWorldSize, &w.group_world_size, 1));
  w.role_rank = w.rank;
  w.role_world_size = w.world_size;
  COHORT_RETURN_IF_ERROR(ReadInt(we::kRoleRank, &w.role_rank, 0));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kRoleWorldSize, &w.role_world_size, 1));
  if (auto v = Get(we::kRoleName); !v.empty()) w.role_name = v;
  w.master_addr = Get(we::kMasterAddr);
  COHORT_RETURN_IF_ERROR(ReadInt(we::kMasterPort, &w.master_port, 0));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kRestartCount, &w.restart_count, 0));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kMaxRestarts, &w.max_restarts, 0));
  w.run_id = Get(we::kRunId);
  if (w.run_id.empty()) w.run_id = Get(we::kCohortRunId);
  w.error_file = Get(we::kErrorFile);
  w.omp_num_threads = OmpThreadsOfThisProcess();

  JobStoreAccess& s = w.store;
  s.round_prefix = Get(we::kStorePrefix);
  const std::string addr = Get(we::kStoreAddr), port = Get(we::kStorePort);
  const std::string endpoints = Get(we::kEtcdEndpoints);
  if (!addr.empty() || !port.empty()) {
    if (addr.empty() || port.empty()) {
      return InvalidArgument("{} is set but {} is not; both name the job's store",
                             addr.empty() ? we::kStorePort : we::kStoreAddr,
                             addr.empty() ? we::kStoreAddr : we::kStorePort);
    }
    s.kind = JobStoreAccess::Kind::kTcp;
    s.addr = addr;
    COHORT_RETURN_IF_ERROR(ReadInt(we::kStorePort, &s.port, 1));
    s.token = Get(we::kToken);
  } else if (!endpoints.empty()) {
    s.kind = JobStoreAccess::Kind::kEtcd;
    s.etcd_endpoints = Split(endpoints, ',');
    s.etcd_prefix = Get(we::kEtcdPrefix);
    if (s.etcd_prefix.empty()) {
      return InvalidArgument("{} is set but {} is not: the job's keys cannot be found",
                             we::kEtcdEndpoints, we::kEtcdPrefix);
    }
    s.etcd_ca_file = Get(we::kEtcdCaCert);
    s.etcd_cert_file = Get(we::kEtcdCert);
    s.etcd_key_file = Get(we::kEtcdKey);
    s.etcd_user = Get(we::kEtcdUser);
    s.etcd_password = Get(we::kEtcdPassword);
    COHORT_RETURN_IF_ERROR(ReadSeconds(we::kEtcdRequestTimeout, &s.etcd_request_timeout_s));
  }
  COHORT_RETURN_IF_ERROR(ReadInt(we::kAttempt, &w.attempt, 0));
  COHORT_RETURN_IF_ERROR(ReadInt(we::kRound, &w.round, 0));
  w.listen_addr = Get(we::kListenAddr);
  w.job_cookie = Get(we::kJobCookie);
  w.flight_recorder_dir = Get(we::kFlightRecorderDir);
  w.metrics_dir = Get(we::kMetricsDir);
  w.membership_dir = Get(we::kMembershipDir);
  w.snapshot_dir = Get(we::kSnapshotDir);
  w.membership_secret = Get(we::kMembershipSecret);
  COHORT_RETURN_IF_ERROR(ReadSeconds(we::kMetricsHistory, &w.metrics_history_s));
  return w;
}

std::string JobStoreMissing(const WorkerEnv& w) {
  if (w.world_size <= 1 || w.store.kind != JobStoreAccess::Kind::kNone) return "";
  return fmt::format(
      "{}={} but this worker has no way to reach its job's store: neither {}/{} (a cohort "
      "store) nor {} (etcd) is set, so it would train alone. Start it with `cohort run` "
      "(torchrun and hand-set variables do not give these)",
      we::kWorldSize, w.world_size, we::kStoreAddr, we::kStorePort, we::kEtcdEndpoints);
}

int OmpThreadsOfThisProcess() {
  auto v = ParseInt64(Get(we::kOmpNumThreads));
  return v && *v > 0 && *v < (1 << 20) ? static_cast<int>(*v) : 0;
}

std::vector<std::pair<std::string, std::string>> ReformedEnvironment(
    const MembershipNotice& n) {
  WorkerEnv w;
  w.rank = w.role_rank = n.rank;
  w.world_size = w.role_world_size = n.world_size;
  w.group_rank = n.group_rank;
  w.group_world_size = n.group_world_size;
  w.master_addr = n.master_addr;
  w.master_port = n.master_port;
  w.restart_count = static_cast<int>(n.restart_count);
  w.store.round_prefix = n.store_prefix;
  w.round = static_cast<int>(n.round);
  // What the round changes, written as a new worker's are. TORCHELASTIC_RESTART_COUNT too:
  // torch's env:// puts the agent-store keys under /worker/attempt_<count>, and a newcomer
  // after a loss (which counts as a restart) has the round's count.
  static const std::set<std::string> kChanged = {
      we::kRank,       we::kWorldSize,  we::kGroupRank,    we::kGroupWorldSize,
      we::kRoleRank,   we::kRoleWorldSize, we::kMasterAddr, we::kMasterPort,
      we::kRestartCount, we::kStorePrefix, we::kRound};
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& kv : WriteWorkerEnv(w)) {
    if (kChanged.count(kv.first)) out.push_back(std::move(kv));
  }
  return out;
}

namespace worker_env {
const std::vector<std::pair<const char*, const char*>>& PythonNames() {
  static const std::vector<std::pair<const char*, const char*>> kNames = {
      {"rank", kRank},
      {"local_rank", kLocalRank},
      {"world_size", kWorldSize},
      {"round", kRound},
      {"membership_dir", kMembershipDir},
      {"membership_secret", kMembershipSecret},
      {"snapshot_dir", kSnapshotDir},
      {"reconfig_timeout", settings::kReconfigTimeout.name()},
  };
  return kNames;
}
}  // namespace worker_env

}  // namespace cohort
