// Test helper (the rendezvous tests, etcd_store_test.cc): agents that join a round at once
// (JoinAll), and a round of N agents that loses some of them, as agents would live it
// (RunLossScenario): every agent joins round 0 on its own Rendezvous and store
// connection; the agents in `lost_slots` (round 0's slots) then go silent, and every other
// one watches the round (its watcher on a connection of its own, as an agent's) until the
// round ends and calls Next again on the Rendezvous that held round 0.
// Thread-safety: one call at a time; it runs and joins its own threads.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/time.h"
#include "cohort/rendezvous/rendezvous.h"

namespace cohort::rendezvous::testing {

struct LossScenario {
  std::vector<std::unique_ptr<Rendezvous>> agents;
  std::vector<std::optional<Result<RendezvousInfo>>> first;  // round 0, by agent
  std::vector<std::optional<RoundEnd>> ended;                // how each survivor saw it end
  std::vector<std::optional<Result<RendezvousInfo>>> next;   // Next() after it, survivors
  std::vector<bool> lost;                                    // by agent
  std::string watch_error;                                   // a watcher's error, if any

  // The agent that held `slot` in round 0 (-1: none).
  int AgentOfSlot(int slot) const {
    for (size_t i = 0; i < first.size(); ++i) {
      if (first[i] && first[i]->ok() && (*first[i])->slot == slot) return static_cast<int>(i);
    }
    return -1;
  }
};

inline NodeInfo ScenarioNode(int i) {
  NodeInfo n;
  n.host = "host" + std::to_string(i);
  n.addr = "10.0.0." + std::to_string(i);
  n.local_world_size = 2;
  return n;
}

// A small round's configuration: beats every 50 ms, a node silent for 300 ms is dead.
inline RendezvousConfig JoinConfig(int min_nodes, int max_nodes) {
  using namespace std::chrono_literals;
  RendezvousConfig c;
  c.run_id = "test";
  c.min_nodes = min_nodes;
  c.max_nodes = max_nodes;
  c.join_timeout = 20s;
  c.last_call = 200ms;
  c.heartbeat_interval = 50ms;
  c.dead_timeout = 300ms;
  c.max_restarts = 3;
  return c;
}

// Runs Next() on `n` agents at once, each on the store `connect` gives it, and returns their
// results in agent order.
inline std::vector<Result<RendezvousInfo>> JoinAll(
    const std::function<std::shared_ptr<store::Store>()>& connect,
    const RendezvousConfig& config, int n) {
  std::vector<std::optional<Result<RendezvousInfo>>> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Rendezvous r(connect(), config, ScenarioNode(i));
      results[i] = r.Next();
    });
  }
  for (auto& t : threads) t.join();
  std::vector<Result<RendezvousInfo>> out;
  for (auto& r : results) out.push_back(std::move(*r));
  return out;
}

// The same, all agents on one (in-process) store.
inline std::vector<Result<RendezvousInfo>> JoinAll(std::shared_ptr<store::Store> store,
                                                   const RendezvousConfig& config, int n) {
  return JoinAll([&] { return store; }, config, n);
}

// `connect` gives each agent and each watcher its own store. Gives up watching after
// `watch_limit` (the scenario's result then says which survivors saw no end). Each survivor
// tells its agent the end its watcher saw (Rendezvous::Told), runs `before_next`, then
// calls Next. A survivor for which `goes_silent(its round-0 info)` turns true, asked before
// each of its watcher's steps, stops there (a node lost later than the others) and counts
// as lost.
inline LossScenario RunLossScenario(const std::function<std::shared_ptr<store::Store>()>& connect,
                                    const RendezvousConfig& config, int n,
                                    const std::vector<int>& lost_slots, Duration watch_limit,
                                    const std::function<void()>& before_next = nullptr,
                                    const std::function<bool(const RendezvousInfo&)>&
                                        goes_silent = nullptr) {
  LossScenario s;
  s.first.resize(n);
  s.ended.resize(n);
  s.next.resize(n);
  s.lost.assign(n, false);
  for (int i = 0; i < n; ++i) {
    s.agents.push_back(std::make_unique<Rendezvous>(connect(), config, ScenarioNode(i)));
  }
  auto run_all = [n](const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back(body, i);
    for (auto& t : threads) t.join();
  };
  run_all([&](int i) { s.first[i] = s.agents[i]->Next(); });
  for (int slot : lost_slots) {
    const int agent = s.AgentOfSlot(slot);
    if (agent >= 0) s.lost[agent] = true;
  }
  const Deadline give_up = Deadline::After(watch_limit);
  std::vector<char> silenced(n, 0);  // by agent, each written by its own thread
  run_all([&](int i) {
    if (s.lost[i] || !s.first[i] || !s.first[i]->ok()) return;
    Rendezvous watcher(connect(), config, ScenarioNode(i));
    while (!s.ended[i] && !give_up.expired()) {
      if (goes_silent && goes_silent(**s.first[i])) {
        silenced[i] = 1;
        return;
      }
      auto step = watcher.WatchStep(**s.first[i]);
      if (!step.ok()) {
        s.watch_error = step.status().ToString();
        return;
      }
      s.ended[i] = *step;
    }
    if (!s.ended[i]) return;
    s.agents[i]->Told(s.first[i]->value().round, *s.ended[i]);  // as an agent does
    if (before_next) before_next();
    s.next[i] = s.agents[i]->Next();
  });
  for (int i = 0; i < n; ++i) {
    if (silenced[i]) s.lost[i] = true;
  }
  return s;
}

}  // namespace cohort::rendezvous::testing
