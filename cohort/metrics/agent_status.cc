// Implements the agent's status record (agent_status.h): the one place it is written to and
// read from JSON.
#include "cohort/metrics/agent_status.h"

#include "cohort/metrics/json_read.h"

namespace cohort::metrics {

using nlohmann::json;
using namespace json_read;

std::string_view WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kInit: return "INIT";
    case WorkerState::kHealthy: return "HEALTHY";
    case WorkerState::kUnhealthy: return "UNHEALTHY";
    case WorkerState::kStopped: return "STOPPED";
    case WorkerState::kSucceeded: return "SUCCEEDED";
    case WorkerState::kFailed: return "FAILED";
  }
  return "UNKNOWN";
}

std::string RankStatus::Ended(const std::string& failure) {
  if (failure.empty()) return std::string(WorkerStateName(WorkerState::kSucceeded));
  return std::string(WorkerStateName(WorkerState::kFailed)) + " (" + failure + ")";
}

json AgentStatus::ToJson() const {
  json list = json::array();
  for (const auto& r : ranks) {
    list.push_back({{"rank", r.rank}, {"local_rank", r.local_rank}, {"pid", r.pid},
                    {"state", r.state}});
  }
  json s = {{"run_id", run_id},         {"host", host},
            {"pid", pid},               {"state", state},
            {"round", round},           {"max_restarts", max_restarts},
            {"nproc_per_node", nproc_per_node}, {"ranks", list}};
  if (joined) {
    s["world_size"] = joined->world_size;
    s["group_rank"] = joined->group_rank;
    s["group_world_size"] = joined->group_world_size;
    s["restarts"] = joined->restarts;
    s["reforms"] = joined->reforms;
    s["budget_used"] = joined->budget_used;
  }
  return s;
}

AgentStatus AgentStatus::FromJson(const json& j) {
  AgentStatus s;
  s.run_id = Str(j, "run_id");
  s.host = Str(j, "host");
  s.pid = Int(j, "pid", 0);
  s.state = Str(j, "state", "UNKNOWN");
  s.round = static_cast<int64_t>(Dbl(j, "round", -1));
  s.max_restarts = Int(j, "max_restarts", 0);
  s.nproc_per_node = Int(j, "nproc_per_node", 0);
  s.has_ranks = At(j, "ranks").is_array();
  for (const auto& r : Arr(j, "ranks")) {
    s.ranks.push_back({.rank = Int(r, "rank", -1), .local_rank = Int(r, "local_rank", 0),
                       .pid = Int(r, "pid", 0), .state = Str(r, "state", "-")});
  }
  if (At(j, "world_size").is_number_integer()) {
    s.joined = RoundStatus{.world_size = Int(j, "world_size"),
                           .group_rank = Int(j, "group_rank"),
                           .group_world_size = Int(j, "group_world_size"),
                           .restarts = Int(j, "restarts"),
                           .reforms = static_cast<int64_t>(Dbl(j, "reforms")),
                           .budget_used = static_cast<int64_t>(Dbl(j, "budget_used"))};
  }
  return s;
}

}  // namespace cohort::metrics
