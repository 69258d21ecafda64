// Carried rounds (RendezvousConfig::carry_start_nodes) on a MemoryStore: the survivors of a
// lost node form the next round without joining it, in their old order, with every node
// lost together left out at once; a node left out that comes back joins as a late node; a
// small round still re-joins; an end whose next round another node closed first is not
// carried; a node arriving before a round's layout waits for it. The same on a real etcd:
// etcd_store_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <regex>
#include <memory>
#include <set>
#include <thread>

#include "cohort/rendezvous/early_timeouts.h"
#include "cohort/rendezvous/log_capture.h"
#include "cohort/rendezvous/loss_scenario.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/memory_store.h"

namespace cohort::rendezvous {
namespace {

using namespace std::chrono_literals;
using testing::LossScenario;
using testing::RunLossScenario;

// Beats every 500 ms, a node silent for 2 s is dead: a live thread is never two periods
// late here, so only the nodes the test silences are taken for lost.
RendezvousConfig CarryConfig(int min_nodes, int max_nodes) {
  RendezvousConfig c = testing::JoinConfig(min_nodes, max_nodes);
  c.run_id = "carry";
  c.heartbeat_interval = 100ms;
  c.dead_timeout = 2s;
  c.max_restarts = 5;
  c.carry_start_nodes = max_nodes;
  return c;
}

// What every survivor of a carried round must see: round 1 with the survivors only, ranks
// 0..N-1 in their round-0 order, the master the first survivor, one restart, no join.
void ExpectCarried(const LossScenario& s, const std::vector<int>& lost_slots,
                   store::Store& store) {
  const int n = static_cast<int>(s.first.size());
  const int survivors = n - static_cast<int>(lost_slots.size());
  std::set<int> ranks;
  int first_survivor_slot = 1;
  while (std::count(lost_slots.begin(), lost_slots.end(), first_survivor_slot)) {
    ++first_survivor_slot;
  }
  const std::string master = testing::ScenarioNode(s.AgentOfSlot(first_survivor_slot)).host;
  for (int i = 0; i < n; ++i) {
    if (s.lost[i]) continue;
    ASSERT_TRUE(s.ended[i].has_value()) << "agent " << i << " saw no end; " << s.watch_error;
    EXPECT_EQ(s.ended[i]->kind, RoundEnd::Kind::kDeadNode) << s.ended[i]->Encode();
    // The end named the carried round (its layout and the restart count) with it.
    ASSERT_TRUE(s.ended[i]->carried.has_value()) << s.ended[i]->Encode();
    EXPECT_EQ(s.ended[i]->carried->restarts, 1);
    ASSERT_TRUE(s.next[i] && s.next[i]->ok()) << s.next[i]->status().ToString();
    const RendezvousInfo& info = **s.next[i];
    const RendezvousInfo& before = **s.first[i];
    EXPECT_EQ(info.round, 1);
    EXPECT_EQ(info.group_world_size, survivors);
    EXPECT_EQ(info.WorldSize(), 2 * survivors);
    EXPECT_EQ(info.restart_count, 1);
    EXPECT_EQ(info.carried.records_round, 0);
    EXPECT_EQ(info.carried.left_out, lost_slots);
    // Its rank: how many survivors came before it in round 0.
    int lower = 0;
    for (int slot = 1; slot < before.slot; ++slot) {
      lower += std::count(lost_slots.begin(), lost_slots.end(), slot) ? 0 : 1;
    }
    EXPECT_EQ(info.group_rank, lower);
    EXPECT_EQ(info.RankOffset(), 2 * lower);
    EXPECT_EQ(info.RecordSlot(info.slot), before.slot);
    EXPECT_EQ(info.master.host, master);
    ranks.insert(info.group_rank);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(survivors));
  // Nobody joined round 1: its join counter was never taken.
  auto tickets = store.Peek({"rdzv/carry/r1/slot"}, Deadline::After(5s));
  ASSERT_TRUE(tickets.ok());
  EXPECT_FALSE((*tickets)[0].has_value()) << *(*tickets)[0];
}

std::function<std::shared_ptr<store::Store>()> On(std::shared_ptr<store::Store> store) {
  return [store] { return store; };
}

// Runs body(0) .. body(n - 1) on threads of their own, at once, and joins them.
void RunEach(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(body, i);
  for (auto& t : threads) t.join();
}

// Watches `info`'s round on a watcher of its own (as an agent's) until it ends.
std::optional<RoundEnd> WatchToEnd(std::shared_ptr<store::Store> store,
                                   const RendezvousConfig& config, int node,
                                   const RendezvousInfo& info) {
  Rendezvous watcher(store, config, testing::ScenarioNode(node));
  const Deadline give_up = Deadline::After(30s);
  while (!give_up.expired()) {
    auto step = watcher.WatchStep(info);
    if (!step.ok()) return std::nullopt;
    if (*step) return *step;
  }
  return std::nullopt;
}

// A store where a node claimed round 0's end, counted its restart and died before writing
// `next` (its claim and count as it left them).
std::shared_ptr<store::MemoryStore> StoreWithAStaleClaim() {
  auto store = std::make_shared<store::MemoryStore>();
  auto seeded = store->MultiSet({"rdzv/carry/r0/ended_by", "rdzv/carry/restarts"},
                                {"dead:node 9 (gone)#5ca1ab1e", "1@0"}, Deadline::After(5s));
  EXPECT_TRUE(seeded.ok()) << seeded.ToString();
  return store;
}

// The job's restart count as the store holds it (the error, if it cannot be read).
std::string Restarts(store::Store& store) {
  auto restarts = store.Get("rdzv/carry/restarts", Deadline::After(5s));
  return restarts.ok() ? *restarts : restarts.status().ToString();
}

TEST(RendezvousCarryTest, TheSurvivorsOfALostNodeFormTheNextRoundWithoutJoining) {
  auto store = std::make_shared<store::MemoryStore>();
  const auto config = CarryConfig(2, 4);
  // Slot 1 is lost: the master moves to the next node, whose record is read for it.
  LossScenario s = RunLossScenario(On(store), config, 4, {1}, 30s);
  ExpectCarried(s, {1}, *store);
  // The survivors' agents list the round's nodes from round 0's records.
  const int agent = s.AgentOfSlot(3);
  auto nodes = s.agents[agent]->RoundNodes(**s.next[agent], Deadline::After(5s));
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_EQ(nodes->size(), 3u);
  for (int slot = 2; slot <= 4; ++slot) {
    EXPECT_EQ((*nodes)[slot - 2].host, testing::ScenarioNode(s.AgentOfSlot(slot)).host);
  }
}

// Told the end (as an agent is by its watcher), a survivor takes the carried round from it
// without reading the store: the round forms even when its layout key is gone by the time
// the survivors call Next (a survivor that read it would find none and join round 1, which
// is closed: it would wait as a late node until the join timeout).
TEST(RendezvousCarryTest, ASurvivorToldTheEndTakesTheCarriedRoundWithoutAReadOfIt) {
  auto store = std::make_shared<store::MemoryStore>();
  auto drop_layout = [&] {
    ASSERT_TRUE(store->Delete("rdzv/carry/r1/layout", Deadline::After(5s)).ok());
  };
  LossScenario s = RunLossScenario(On(store), CarryConfig(2, 4), 4, {3}, 30s, drop_layout);
  ExpectCarried(s, {3}, *store);
}

// A node that claimed round 0's end, counted its restart and died before writing `next`
// (its claim and count seeded as it left them): the survivors that find the lost node lose
// the claim to it, wait for its `next` a layout grace, and one of them takes the end over.
// The round is carried as by any winner, and the failure counted once, not twice. The
// grace is longer than the dead timeout: a loser beats while it waits, so no watcher takes
// it for dead and the taker carries it (one that did not was left out of the carried round).
TEST(RendezvousCarryTest, AClaimWhoseNextNeverComesIsTakenOverAndCountedOnce) {
  auto store = StoreWithAStaleClaim();
  auto config = CarryConfig(2, 4);
  config.layout_grace = 4s;  // twice the dead timeout
  LossScenario s = RunLossScenario(On(store), config, 4, {3}, 30s);
  ExpectCarried(s, {3}, *store);
  auto claim = store->Get("rdzv/carry/r0/ended_by", Deadline::After(5s));
  ASSERT_TRUE(claim.ok());
  EXPECT_NE(*claim, "dead:node 9 (gone)#5ca1ab1e") << "the stale claim was taken over";
  EXPECT_EQ(Restarts(*store), "1@0");
}

// After a takeover the job goes on as after any end: the carried round it made loses
// another node, whose watcher ends it (no stale claim there) and carries the survivors
// again. Both losses are left out, the restart count is 2, counted by round 1's end.
TEST(RendezvousCarryTest, ARoundCarriedByATakeoverIsCarriedAgainAtTheNextLoss) {
  auto store = StoreWithAStaleClaim();
  auto config = CarryConfig(2, 5);
  config.carry_start_nodes = 4;  // round 1 (4 nodes) is carried too
  config.layout_grace = 1s;
  LossScenario s = RunLossScenario(On(store), config, 5, {3}, 30s);
  ExpectCarried(s, {3}, *store);
  const int second = s.AgentOfSlot(5);  // round 0's slot 5: round 1's slot 4
  std::vector<std::optional<Result<RendezvousInfo>>> again(5);
  RunEach(5, [&](int i) {
    if (s.lost[i] || i == second) return;
    auto end = WatchToEnd(store, config, i, **s.next[i]);
    ASSERT_TRUE(end.has_value()) << "agent " << i << " saw no end of round 1";
    EXPECT_EQ(end->kind, RoundEnd::Kind::kDeadNode) << end->Encode();
    s.agents[i]->Told(1, *end);
    again[i] = s.agents[i]->Next();
  });
  std::set<int> ranks;
  for (int i = 0; i < 5; ++i) {
    if (s.lost[i] || i == second) continue;
    ASSERT_TRUE(again[i] && again[i]->ok()) << again[i]->status().ToString();
    const RendezvousInfo& info = **again[i];
    EXPECT_EQ(info.round, 2);
    EXPECT_EQ(info.group_world_size, 3);
    EXPECT_EQ(info.restart_count, 2);
    EXPECT_EQ(info.carried.records_round, 0);
    EXPECT_EQ(info.carried.left_out, (std::vector<int>{3, 5}));
    ranks.insert(info.group_rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(Restarts(*store), "2@1");
}

TEST(RendezvousCarryTest, ACarriedEndRoundTripsWhateverItsDetailSays) {
  RoundEnd end{RoundEnd::Kind::kDeadNode, "node 2 (h:carried:1:2:x) stopped\nsending"};
  end.carried = RoundEnd::Carried{3, "2:8x2\n{\"host\":\"a:b\"}\ncarried:0:2"};
  const RoundEnd back = RoundEnd::Decode(end.Encode());
  EXPECT_EQ(back.kind, end.kind);
  EXPECT_EQ(back.detail, end.detail);
  ASSERT_TRUE(back.carried.has_value());
  EXPECT_EQ(back.carried->restarts, 3);
  EXPECT_EQ(back.carried->layout, end.carried->layout);
  // An end that carried nothing has no carried round; a malformed one is a failure that
  // says the whole text (as any text this layer does not know), carrying nothing.
  EXPECT_FALSE(RoundEnd::Decode("join:host-b").carried.has_value());
  const RoundEnd bad = RoundEnd::Decode("carried:1:999:short");
  EXPECT_EQ(bad.kind, RoundEnd::Kind::kFailure);
  EXPECT_EQ(bad.detail, "carried:1:999:short");
  EXPECT_FALSE(bad.carried.has_value());
}

TEST(RendezvousCarryTest, NodesLostTogetherAreLeftOutOfOneCarriedRound) {
  auto store = std::make_shared<store::MemoryStore>();
  LossScenario s = RunLossScenario(On(store), CarryConfig(2, 5), 5, {2, 4}, 30s);
  ExpectCarried(s, {2, 4}, *store);
}

// A node lost while the survivors wait out a stale claim: slot 5 stops once a watcher has
// said it found slot 3 lost (it then claims the end, loses it to the stale claim and
// waits). The node that takes the end over finds both silent: one carried round of the
// three others, both left out, the failure counted once.
TEST(RendezvousCarryTest, ANodeLostWhileAStaleClaimIsWaitedOutIsLeftOutOfTheTakeoversRound) {
  auto store = StoreWithAStaleClaim();
  auto config = CarryConfig(2, 5);
  config.layout_grace = 4s;  // twice the dead timeout: slot 5 is silent by then
  testing::RendezvousLog log;
  const std::regex found_lost(R"(round 0: node 2 \()");  // slot 3
  LossScenario s = RunLossScenario(On(store), config, 5, {3}, 30s, nullptr,
                                   [&](const RendezvousInfo& first) {
                                     return first.slot == 5 && log.Said(found_lost);
                                   });
  ASSERT_TRUE(s.lost[s.AgentOfSlot(5)]) << "slot 5 never stopped";
  ExpectCarried(s, {3, 5}, *store);
  EXPECT_TRUE(log.Said(std::regex("wrote no `next` within the layout grace")));
  EXPECT_EQ(Restarts(*store), "1@0");
}

// The node of `slot`, left out of round 1, comes back: its Next finds round 1 carried
// without it and asks for a re-rendezvous (as a late node); the survivors' round 1 ends for
// the join, and all four form round 2 with ranks 0-3.
void ExpectTheLeftOutNodeJoinsRound2(LossScenario& s, std::shared_ptr<store::Store> store,
                                     const RendezvousConfig& config, int slot) {
  const int back = s.AgentOfSlot(slot);
  std::vector<std::optional<Result<RendezvousInfo>>> again(4);
  RunEach(4, [&](int i) {
    if (i == back) {
      again[i] = s.agents[i]->Next();
      return;
    }
    auto end = WatchToEnd(store, config, i, **s.next[i]);
    ASSERT_TRUE(end.has_value()) << "agent " << i << " saw no end of round 1";
    EXPECT_EQ(end->kind, RoundEnd::Kind::kJoin) << end->Encode();
    again[i] = s.agents[i]->Next();
  });
  std::set<int> ranks;
  for (auto& r : again) {
    ASSERT_TRUE(r && r->ok()) << r->status().ToString();
    EXPECT_EQ((*r)->round, 2);
    EXPECT_EQ((*r)->group_world_size, 4);
    EXPECT_TRUE((*r)->carried.left_out.empty());
    ranks.insert((*r)->group_rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
}

// The "lost" node was only slow: it joins the next round as a late node.
TEST(RendezvousCarryTest, ANodeLeftOutThatComesBackJoinsAsALateNode) {
  auto store = std::make_shared<store::MemoryStore>();
  const auto config = CarryConfig(2, 4);
  LossScenario s = RunLossScenario(On(store), config, 4, {2}, 30s);
  ExpectCarried(s, {2}, *store);
  ExpectTheLeftOutNodeJoinsRound2(s, store, config, 2);
}

// The same after a takeover: the round it carried ends for the join as any round does; a
// join is not a failure (the restart count stays as the takeover's end left it).
TEST(RendezvousCarryTest, ARoundCarriedByATakeoverEndsForANodeThatJoins) {
  auto store = StoreWithAStaleClaim();
  auto config = CarryConfig(2, 4);
  config.layout_grace = 1s;
  LossScenario s = RunLossScenario(On(store), config, 4, {2}, 30s);
  ExpectCarried(s, {2}, *store);
  ExpectTheLeftOutNodeJoinsRound2(s, store, config, 2);
  EXPECT_EQ(Restarts(*store), "1@0");
}

TEST(RendezvousCarryTest, ASmallerRoundIsJoinedAgain) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = CarryConfig(2, 4);
  config.carry_start_nodes = 5;
  LossScenario s = RunLossScenario(On(store), config, 4, {3}, 30s);
  for (int i = 0; i < 4; ++i) {
    if (s.lost[i]) continue;
    ASSERT_TRUE(s.next[i] && s.next[i]->ok()) << s.watch_error;
    EXPECT_EQ((*s.next[i])->round, 1);
    EXPECT_EQ((*s.next[i])->group_world_size, 3);
    EXPECT_EQ((*s.next[i])->carried.records_round, -1);
  }
  auto tickets = store->Peek({"rdzv/carry/r1/slot"}, Deadline::After(5s));
  ASSERT_TRUE(tickets.ok());
  EXPECT_EQ((*tickets)[0], "3");
}

// The end writes the carried round's `closed`, its layout and `next` together or not at
// all: when another node closed the next round first, the end is written uncarried (its
// survivors join) and neither key of the round it would have carried is touched.
TEST(RendezvousCarryTest, AnEndWhoseNextRoundWasClosedFirstIsNotCarried) {
  auto store = std::make_shared<store::MemoryStore>();
  const auto config = CarryConfig(2, 3);
  std::vector<std::unique_ptr<Rendezvous>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::make_unique<Rendezvous>(store, config, testing::ScenarioNode(i)));
  }
  std::vector<std::optional<Result<RendezvousInfo>>> round0(3);
  RunEach(3, [&](int i) { round0[i] = nodes[i]->Next(); });
  for (auto& r : round0) ASSERT_TRUE(r && r->ok()) << r->status().ToString();
  ASSERT_TRUE(store->Set("rdzv/carry/r1/closed", "7", Deadline::After(5s)).ok());
  const RendezvousInfo& info = **round0[0];
  const int lost_slot = info.slot == 3 ? 2 : 3;
  FailureRecord lost{0, "gone", 1, 0, "lost"};
  auto won = nodes[0]->EndRoundForLostNode(
      info, lost_slot, RoundEnd{RoundEnd::Kind::kDeadNode, "node lost"}, lost);
  ASSERT_TRUE(won.ok()) << won.status().ToString();
  EXPECT_TRUE(*won);
  auto now = store->Peek({"rdzv/carry/r0/next", "rdzv/carry/r1/closed", "rdzv/carry/r1/layout",
                          "rdzv/carry/restarts"},
                         Deadline::After(5s));
  ASSERT_TRUE(now.ok());
  ASSERT_TRUE((*now)[0].has_value());
  const RoundEnd end = RoundEnd::Decode(*(*now)[0]);
  EXPECT_EQ(end.kind, RoundEnd::Kind::kDeadNode) << *(*now)[0];
  EXPECT_FALSE(end.carried.has_value()) << *(*now)[0];
  EXPECT_EQ((*now)[1], "7");
  EXPECT_FALSE((*now)[2].has_value());
  EXPECT_EQ((*now)[3], "1@0");  // one restart, by round 0's end
}

// A node that arrives at a large round closed a moment ago, before its slot 1 published the
// layout, waits for the layout and is appended (before, it ended the round uncarried and
// every node joined again: 10,000 at once on a loaded etcd, docs/scale.md).
TEST(RendezvousCarryTest, ANodeArrivingBeforeTheLayoutWaitsForItAndIsAppended) {
  auto store = std::make_shared<store::MemoryStore>();
  auto carry = CarryConfig(2, 6);
  carry.carry_start_nodes = 4;
  carry.last_call = 2s;  // round 0: all four
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < 4; ++i) {
    agents.push_back(std::make_unique<Rendezvous>(store, carry, testing::ScenarioNode(i)));
  }
  auto late_store = std::make_shared<testing::EarlyTimeouts>(store);
  agents.push_back(std::make_unique<Rendezvous>(late_store, carry, testing::ScenarioNode(4)));
  std::vector<std::optional<Result<RendezvousInfo>>> first(4), second(5);
  RunEach(4, [&](int i) { first[i] = agents[i]->Next(); });
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(first[i]->ok()) << first[i]->status().ToString();
  // The layout is not there yet when node 4 arrives; it comes once node 4 waits for it.
  const std::string layout_key = "rdzv/carry/r0/layout";
  auto layout = store->Get(layout_key, Deadline::After(5s));
  ASSERT_TRUE(layout.ok());
  ASSERT_TRUE(*store->Delete(layout_key, Deadline::After(5s)));
  late_store->CountGets(layout_key);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { second[4] = agents[4]->Next(); });
  const Deadline give_up = Deadline::After(30s);
  while (late_store->counted_gets == 0 && !give_up.expired()) std::this_thread::yield();
  EXPECT_GT(late_store->counted_gets, 0) << "node 4 did not wait for the layout";
  ASSERT_TRUE(store->Set(layout_key, *layout, Deadline::After(5s)).ok());
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto end = WatchToEnd(store, carry, i, **first[i]);
      ASSERT_TRUE(end.has_value());
      EXPECT_EQ(end->kind, RoundEnd::Kind::kJoin) << end->Encode();
      EXPECT_TRUE(end->carried.has_value()) << end->Encode();
      second[i] = agents[i]->Next();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(second[i] && second[i]->ok()) << second[i]->status().ToString();
    EXPECT_EQ((*second[i])->round, 1);
    EXPECT_EQ((*second[i])->group_world_size, 5);
    EXPECT_EQ((*second[i])->group_rank, i == 4 ? 4 : (*first[i])->group_rank);
  }
  auto tickets = store->Peek({"rdzv/carry/r1/slot"}, Deadline::After(5s));
  ASSERT_TRUE(tickets.ok());
  EXPECT_FALSE((*tickets)[0].has_value()) << "a node joined the carried round";
}

// A node that arrives at a large running round is appended to it (carried with its
// members, who do not join again), and stays itself through a later carried round that
// loses one of the others: its rank moves down, its record is the one it brought.
TEST(RendezvousCarryTest, ANodeArrivingAtALargeRoundIsAppendedToIt) {
  auto store = std::make_shared<store::MemoryStore>();
  auto carry = CarryConfig(2, 6);
  carry.carry_start_nodes = 4;
  carry.last_call = 2s;  // round 0: all four (it waits the whole last call for six)
  std::vector<std::unique_ptr<Rendezvous>> agents;
  std::vector<std::optional<Result<RendezvousInfo>>> first(5), second(5), third(5);
  for (int i = 0; i < 5; ++i) {
    agents.push_back(std::make_unique<Rendezvous>(store, carry, testing::ScenarioNode(i)));
  }
  RunEach(4, [&](int i) { first[i] = agents[i]->Next(); });
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(first[i]->ok()) << first[i]->status().ToString();
  // Node 4 arrives: round 1 is round 0's four and it, as rank 4.
  RunEach(5, [&](int i) {
    if (i == 4) {
      second[4] = agents[4]->Next();
      return;
    }
    auto end = WatchToEnd(store, carry, i, **first[i]);
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->kind, RoundEnd::Kind::kJoin) << end->Encode();
    second[i] = agents[i]->Next();
  });
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(second[i]->ok()) << second[i]->status().ToString();
    const RendezvousInfo& info = **second[i];
    EXPECT_EQ(info.round, 1);
    EXPECT_EQ(info.group_world_size, 5);
    EXPECT_EQ(info.WorldSize(), 10);
    EXPECT_EQ(info.restart_count, 0);
    EXPECT_EQ(info.group_rank, i == 4 ? 4 : (*first[i])->group_rank);
    EXPECT_EQ(info.carried.appended.size(), 1u);
  }
  auto tickets = store->Peek({"rdzv/carry/r1/slot"}, Deadline::After(5s));
  ASSERT_TRUE(tickets.ok());
  EXPECT_FALSE((*tickets)[0].has_value()) << "a node joined the carried round";
  // Round 1 loses the node of round-0 slot 2: round 2 keeps the appended node, now rank 3.
  int lost = 0;
  while ((*first[lost])->slot != 2) ++lost;
  RunEach(5, [&](int i) {
    if (i == lost) return;
    auto end = WatchToEnd(store, carry, i, **second[i]);
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->kind, RoundEnd::Kind::kDeadNode) << end->Encode();
    third[i] = agents[i]->Next();
  });
  for (int i = 0; i < 5; ++i) {
    if (i == lost) continue;
    ASSERT_TRUE(third[i]->ok()) << third[i]->status().ToString();
    const RendezvousInfo& info = **third[i];
    EXPECT_EQ(info.round, 2);
    EXPECT_EQ(info.group_world_size, 4);
    EXPECT_EQ(info.carried.left_out, std::vector<int>{2});
    const int before = (**second[i]).group_rank;
    EXPECT_EQ(info.group_rank, before > 1 ? before - 1 : before);
  }
  auto nodes = agents[4]->RoundNodes(**third[4], Deadline::After(5s));
  ASSERT_TRUE(nodes.ok()) << nodes.status().ToString();
  ASSERT_EQ(nodes->size(), 4u);
  EXPECT_EQ((*nodes)[3].host, "host4");
}

TEST(RendezvousCarryTest, ACarriedLayoutRoundTrips) {
  std::vector<NodeInfo> nodes(5);
  for (int i = 0; i < 5; ++i) nodes[i].local_world_size = i < 3 ? 8 : 4;
  const RoundLayout without = RoundLayout::FromNodes(nodes).Without({1, 3});
  EXPECT_EQ(without.Encode(), "3:8x2,4x1");
  // Which node a worker's peer runs on (a lost peer's node: the agent ends for it).
  const RoundLayout whole = RoundLayout::FromNodes(nodes);  // ranks 0-23 on 3 x 8, 24-31 on 2 x 4
  EXPECT_EQ(whole.GroupRankOf(0), 0);
  EXPECT_EQ(whole.GroupRankOf(23), 2);
  EXPECT_EQ(whole.GroupRankOf(24), 3);
  EXPECT_EQ(whole.GroupRankOf(31), 4);
  EXPECT_EQ(whole.GroupRankOf(32), -1);
  EXPECT_EQ(whole.GroupRankOf(-1), -1);
  RendezvousInfo info;
  info.round = 4;
  info.carried.left_out = {2, 5};
  EXPECT_EQ(info.RecordsRound(), 4);
  EXPECT_EQ(info.RecordSlot(1), 1);
  EXPECT_EQ(info.RecordSlot(2), 3);
  EXPECT_EQ(info.RecordSlot(4), 6);
}

}  // namespace
}  // namespace cohort::rendezvous
