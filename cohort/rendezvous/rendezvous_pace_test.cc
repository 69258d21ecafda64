// A quiet round's pace (Rendezvous::FollowPace): a store that answers beats slowly makes the
// round beat less often, and one that answers quickly again brings the pace back, without
// a live node ever taken for dead. Agents as threads over one MemoryStore.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include "cohort/rendezvous/early_timeouts.h"
#include "cohort/rendezvous/log_capture.h"
#include "cohort/rendezvous/loss_scenario.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/rendezvous/rendezvous_internal.h"
#include "cohort/store/memory_store.h"

namespace cohort::rendezvous {
namespace {

using namespace std::chrono_literals;
using testing::EarlyTimeouts;

// Four nodes, quiet from two: a dead timeout of 1 s, so beats every 250 ms at pace 1.
RendezvousConfig PaceConfig() {
  RendezvousConfig c;
  c.run_id = "pace";
  c.min_nodes = 4;
  c.max_nodes = 4;
  c.join_timeout = 20s;
  c.last_call = 200ms;
  c.heartbeat_interval = 50ms;
  c.dead_timeout = 1s;
  c.quiet_start_nodes = 2;
  c.quiet_beats_per_s = 16;  // 4 nodes: the quiet dead timeout is 1 s too
  c.tell_start_nodes = 0;
  c.quiet_watch_max_nodes = 0;
  return c;
}

NodeInfo Node(int i) { return testing::ScenarioNode(i); }

// The pace each "now beat every ... (pace K)" line of `log` announced, in order.
std::vector<int64_t> PaceChanges(testing::RendezvousLog& log) {
  std::vector<int64_t> out;
  const std::regex change(R"(now beat every [0-9.]+ s \(pace ([0-9]+)\))");
  for (const auto& line : log.Lines()) {
    std::smatch m;
    if (std::regex_search(line, m, change)) out.push_back(std::stoll(m[1]));
  }
  return out;
}

// r<R>/pace as a pace (0: absent or not one).
int64_t PaceOf(const std::optional<std::string>& text) {
  return text ? ParsePace(*text).value_or(0) : 0;
}

// Each node's watcher steps through `info`'s round until `pace` reads as wanted (then a
// little longer, so every node beats at it) or `limit`; any end it saw (a node taken for
// dead) is returned in `ends`.
void WatchUntil(std::vector<std::unique_ptr<Rendezvous>>& watchers,
                const std::vector<RendezvousInfo>& infos, store::Store& store,
                const std::function<bool(const std::optional<std::string>&)>& wanted,
                Duration limit, std::vector<std::string>& ends) {
  const Deadline give_up = Deadline::After(limit);
  std::atomic<bool> reached{false};
  std::optional<Deadline> stop;
  std::vector<std::thread> threads;
  Mutex mu;
  for (size_t i = 0; i < watchers.size(); ++i) {
    threads.emplace_back([&, i] {
      while (!give_up.expired()) {
        auto step = watchers[i]->WatchStep(infos[i]);
        if (!step.ok() || *step) {
          MutexLock lock(&mu);
          ends.push_back(step.ok() ? (*step)->Encode() : step.status().ToString());
          return;
        }
        if (reached) return;
      }
    });
  }
  while (!give_up.expired() && !reached) {
    auto pace = store.Peek({"rdzv/pace/r0/pace"}, Deadline::After(1s));
    if (pace.ok() && wanted((*pace)[0])) {
      if (!stop) stop = Deadline::After(2s);  // every node beats at it a few times
      if (stop->expired()) reached = true;
    }
    std::this_thread::sleep_for(20ms);
  }
  reached = true;
  for (auto& t : threads) t.join();
}

// Four nodes, each an agent's Rendezvous and a watcher's, form round 0 at once: `infos` by
// node.
void FormRound(const std::shared_ptr<store::Store>& store, const RendezvousConfig& config,
               std::vector<std::unique_ptr<Rendezvous>>& agents,
               std::vector<std::unique_ptr<Rendezvous>>& watchers,
               std::vector<RendezvousInfo>& infos) {
  std::vector<std::optional<Result<RendezvousInfo>>> joined(4);
  for (int i = 0; i < 4; ++i) {
    agents.push_back(std::make_unique<Rendezvous>(store, config, Node(i)));
    watchers.push_back(std::make_unique<Rendezvous>(store, config, Node(i)));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { joined[i] = agents[i]->Next(); });
  for (auto& t : threads) t.join();
  for (auto& j : joined) {
    ASSERT_TRUE(j->ok()) << j->status().ToString();
    infos.push_back(**j);
  }
}

TEST(RendezvousPaceTest, SlowBeatsSlowTheRoundAndQuickOnesBringItBackWithNoNodeTakenForDead) {
  auto store = std::make_shared<EarlyTimeouts>(std::make_shared<store::MemoryStore>());
  store->OfferIdle();
  const auto config = PaceConfig();
  std::vector<std::unique_ptr<Rendezvous>> agents, watchers;
  std::vector<RendezvousInfo> infos;
  testing::RendezvousLog log;
  ASSERT_NO_FATAL_FAILURE(FormRound(store, config, agents, watchers, infos));
  // Beats answered 100 ms late: more than a quarter of the 250 ms period. Two setters
  // raise the pace at once (their compare-and-sets held until both came).
  store->GatherCompareSets("rdzv/pace/r0/pace", 2);
  store->SlowBeats(100ms);
  std::vector<std::string> ends;
  auto raised = [&](const std::optional<std::string>& p) {
    return PaceOf(p) > infos[0].pace;
  };
  WatchUntil(watchers, infos, *store, raised, 20s, ends);
  EXPECT_TRUE(ends.empty()) << ends[0];
  auto pace = store->Peek({"rdzv/pace/r0/pace"}, Deadline::After(1s));
  ASSERT_TRUE(pace.ok());
  ASSERT_TRUE((*pace)[0].has_value()) << "the slow beats did not raise the pace";
  const int64_t slowed = PaceOf((*pace)[0]);
  EXPECT_GE(slowed, 2);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(watchers[i]->DeadTimeout(infos[i]), config.dead_timeout * slowed) << "node " << i;
  }
  // Answered at once again: the pace comes back to the one the round started at (1 unless
  // this machine took longer than a beat period to form it: StartPace), halving after calm
  // beats.
  store->SlowBeats(Duration{});
  const int64_t start = infos[0].pace;
  auto back = [&](const std::optional<std::string>& p) { return PaceOf(p) == start; };
  WatchUntil(watchers, infos, *store, back, 60s, ends);
  EXPECT_TRUE(ends.empty()) << ends[0];
  pace = store->Peek({"rdzv/pace/r0/pace"}, Deadline::After(1s));
  ASSERT_TRUE(pace.ok());
  EXPECT_EQ(PaceOf((*pace)[0]), start);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(watchers[i]->DeadTimeout(infos[i]), config.dead_timeout * start) << "node " << i;
  }
  // Every node sets the pace here (four nodes, about eight setters): each change is logged
  // by the one setter that wrote it, so no two changes in a row name the same pace (the two
  // setters that raised it at once both logged it, until 2026-12-07).
  const std::vector<int64_t> changes = PaceChanges(log);
  EXPECT_TRUE(store->gathered) << "no two setters raised the pace at once";
  ASSERT_GE(changes.size(), 2u);
  EXPECT_GT(changes.front(), start);
  EXPECT_EQ(changes.back(), start);
  for (size_t i = 1; i < changes.size(); ++i) {
    EXPECT_NE(changes[i], changes[i - 1]) << "change " << i << " logged twice";
  }
}

// A round whose nodes came slowly (the last a second after the others: 4 joins a second,
// where its beats at pace 1 would come 16 a second) starts at the largest start pace, 4:
// every node reads it with the layout and beats at it from its first step.
TEST(RendezvousPaceTest, ARoundThatFormedSlowlyStartsAtASlowerPace) {
  auto store = std::make_shared<EarlyTimeouts>(std::make_shared<store::MemoryStore>());
  store->OfferIdle();
  const auto config = PaceConfig();
  std::vector<std::optional<Result<RendezvousInfo>>> joined(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      if (i == 3) std::this_thread::sleep_for(1s);  // the late one
      Rendezvous agent(store, config, Node(i));
      joined[i] = agent.Next();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(joined[i]->ok()) << joined[i]->status().ToString();
    const RendezvousInfo& info = **joined[i];
    EXPECT_EQ(info.pace, 4) << "node " << i;
    Rendezvous watcher(store, config, Node(i));
    auto step = watcher.WatchStep(info);  // the first step of a quiet round: rests
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(watcher.DeadTimeout(info), 4 * config.dead_timeout) << "node " << i;
  }
}

// An agent ends a carried round for its worker's lost peer on a Rendezvous of its own, which
// watches no round: it finds who else is silent at the pace the store holds, not the one the
// round started at. Here the round beats at pace 4 (every second); at the start pace its
// nodes would look silent after half a second and be left out of the carried round.
TEST(RendezvousPaceTest, AnAgentEndingARoundForItsWorkersLostPeerJudgesSilenceAtTheStoresPace) {
  auto store = std::make_shared<EarlyTimeouts>(std::make_shared<store::MemoryStore>());
  store->OfferIdle();
  auto config = PaceConfig();
  config.min_nodes = 2;
  config.carry_start_nodes = 4;
  config.max_restarts = 5;
  std::vector<std::unique_ptr<Rendezvous>> agents, watchers;
  std::vector<RendezvousInfo> infos;
  ASSERT_NO_FATAL_FAILURE(FormRound(store, config, agents, watchers, infos));
  const auto formed = SteadyClock::now();
  // A pace setter raised it (beats answered in 100 ms keep it there: neither slow nor calm
  // at a 1 s period).
  ASSERT_TRUE(store->Set("rdzv/pace/r0/pace", "4", Deadline::After(1s)).ok());
  store->SlowBeats(100ms);
  std::vector<std::atomic<bool>> at_pace(4);
  std::vector<std::optional<RoundEnd>> ends(4);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  const Deadline give_up = Deadline::After(20s);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      while (!ends[i] && !give_up.expired()) {
        auto step = watchers[i]->WatchStep(infos[i]);
        if (!step.ok()) {
          errors[i] = step.status().ToString();
          return;
        }
        ends[i] = *step;
        if (watchers[i]->DeadTimeout(infos[i]) == 4 * config.dead_timeout) at_pace[i] = true;
      }
    });
  }
  // Every node beats at pace 4, and the round is older than two beat periods at pace 1.
  while (!give_up.expired()) {
    bool all = SteadyClock::now() - formed > 2500ms;
    for (auto& a : at_pace) all = all && a;
    if (all) break;
    std::this_thread::sleep_for(20ms);
  }
  int ender = 0, lost = 0;
  for (int i = 0; i < 4; ++i) {
    if (infos[i].slot == 1) ender = i;
    if (infos[i].slot == 2) lost = i;
  }
  FailureRecord record{2, Node(lost).host, 1, 0, "its worker's peer exited"};
  auto won = agents[ender]->EndRoundForLostNode(
      infos[ender], 2, RoundEnd{RoundEnd::Kind::kDeadNode, "a worker's peer lost"}, record);
  for (auto& t : threads) t.join();
  ASSERT_TRUE(won.ok()) << won.status().ToString();
  EXPECT_TRUE(*won);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(errors[i].empty()) << "node " << i << ": " << errors[i];
    ASSERT_TRUE(ends[i].has_value()) << "node " << i << " saw no end";
    EXPECT_EQ(ends[i]->detail, "a worker's peer lost") << ends[i]->Encode();
    if (i == lost) continue;
    ASSERT_TRUE(ends[i]->carried.has_value()) << ends[i]->Encode();
    agents[i]->Told(0, *ends[i]);
    auto next = agents[i]->Next();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(next->round, 1) << "node " << i << " was left out";
    EXPECT_EQ(next->group_world_size, 3);
    EXPECT_EQ(next->carried.left_out, std::vector<int>{2});
  }
}

}  // namespace
}  // namespace cohort::rendezvous
