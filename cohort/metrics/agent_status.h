// The agent's status as the dashboards, `cohort top` and `cohort run`'s own metrics server
// see it: one struct, written by the agent and read back from JSON in one place (the
// "agent" object of /api/state). Reading tolerates another agent's broken or hostile
// answer: a missing field or one of another type reads as absent.
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::metrics {

// A worker group's state, as torch elastic names them.
enum class WorkerState { kInit, kHealthy, kUnhealthy, kStopped, kSucceeded, kFailed };
std::string_view WorkerStateName(WorkerState state);

// One local worker: "HEALTHY" while it runs, "SUCCEEDED", or "FAILED (<how it ended>)".
struct RankStatus {
  int rank = -1;
  int local_rank = 0;
  int pid = 0;
  std::string state;
  bool healthy() const { return state == WorkerStateName(WorkerState::kHealthy); }
  // The state of a worker that exited: `failure` empty when it succeeded.
  static std::string Ended(const std::string& failure);
};

// Known once the agent joined a round.
struct RoundStatus {
  int world_size = 0;
  int group_rank = 0;
  int group_world_size = 0;
  int restarts = 0;     // worker groups this node started after its first
  int64_t reforms = 0;  // rounds its workers joined in place (live reconfiguration)
  int64_t budget_used = 0;  // job-wide restarts spent
};

struct AgentStatus {
  std::string run_id;
  std::string host;
  int pid = 0;
  std::string state;  // WorkerStateName of the group
  int64_t round = -1;
  int max_restarts = 0;
  int nproc_per_node = 0;
  std::vector<RankStatus> ranks;
  std::optional<RoundStatus> joined;

  nlohmann::json ToJson() const;
  // Absent fields keep their defaults.
  static AgentStatus FromJson(const nlohmann::json& j);
  // FromJson: whether the answer carried a list of ranks (an agent that does not say which
  // ranks are its own has none).
  bool has_ranks = false;
};

}  // namespace cohort::metrics
