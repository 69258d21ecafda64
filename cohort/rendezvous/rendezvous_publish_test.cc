// Who publishes a round's layout (Rendezvous::PublishLayout): slot 1, or, when it stalls,
// one node at a time in its place (the first to claim r<R>/publisher, then the first to
// take the claim over from a claimant that stalled too), never every node (each would read
// the N records). Agents as threads over one MemoryStore, behind EarlyTimeouts where the
// store must time requests out or count the reads of the records.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cohort/rendezvous/early_timeouts.h"
#include "cohort/rendezvous/log_capture.h"
#include "cohort/rendezvous/loss_scenario.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/memory_store.h"

namespace cohort::rendezvous {
namespace {

using namespace std::chrono_literals;
using testing::EarlyTimeouts;
using testing::JoinAll;
using testing::JoinConfig;
using testing::ScenarioNode;

// A node that joins round `round` (its ticket and record) and then never gets further: the
// slot it took (-1: the store refused).
int64_t StalledJoin(store::MemoryStore& memory, int round, int node) {
  const std::string r = "rdzv/test/r" + std::to_string(round);
  auto slot = memory.Append(r + "/slot", r + "/node", ScenarioNode(node).ToJson(),
                            Deadline::AfterMs(5000));
  return slot.ok() ? *slot : -1;
}

// Every agent formed one round of `world` nodes whose master is `master`: their ranks.
std::set<int> FormedRanks(const std::vector<Result<RendezvousInfo>>& results, int world,
                          const std::string& master) {
  std::set<int> ranks;
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) continue;
    EXPECT_EQ(r->group_world_size, world);
    EXPECT_EQ(r->master.host, master);
    ranks.insert(r->group_rank);
  }
  return ranks;
}

TEST(RendezvousPublishTest, EarlyStoreTimeoutsDoNotMakeNodesTakeOverFromSlotOne) {
  auto store = std::make_shared<EarlyTimeouts>(std::make_shared<store::MemoryStore>());
  auto config = JoinConfig(4, 4);
  // Three nodes join at once; the fourth 300 ms later: the others' reads time out (in the
  // store) many times meanwhile, well within the layout grace.
  std::vector<std::optional<Result<RendezvousInfo>>> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      if (i == 3) std::this_thread::sleep_for(300ms);  // a late node, not synchronisation
      results[i] = Rendezvous(store, config, ScenarioNode(i)).Next();
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> ranks;
  for (auto& r : results) {
    ASSERT_TRUE(r->ok()) << r->status().ToString();
    EXPECT_EQ((*r)->group_world_size, 4);
    ranks.insert((*r)->group_rank);
  }
  EXPECT_EQ(ranks.size(), 4u);
  EXPECT_EQ(store->record_reads, 1) << "a node other than slot 1 read the N records";
}

TEST(RendezvousPublishTest, OneNodeTakesOverFromAStalledSlotOne) {
  auto memory = std::make_shared<store::MemoryStore>();
  auto store = std::make_shared<EarlyTimeouts>(memory);
  auto config = JoinConfig(6, 6);
  config.layout_grace = 200ms;
  // Slot 1 joins (ticket and record) and then never gets further.
  ASSERT_EQ(StalledJoin(*memory, 0, 9), 1);
  EXPECT_EQ(FormedRanks(JoinAll(store, config, 5), 6, "host9"), (std::set<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(store->record_reads, 1) << "more than one node read the N records";
}

// Slot 1 stalls and so does the node that took its place (slot 2, its claim on
// r<R>/publisher left as it was): one node takes the claim over from it and publishes, the
// others give it a grace as they gave slot 2 (every node past slot 2's grace read the N
// records, until 2026-12-07: N^2 reads on a store already too slow to answer).
TEST(RendezvousPublishTest, OneNodeTakesOverFromAStalledClaimantOfTheLayout) {
  auto memory = std::make_shared<store::MemoryStore>();
  auto store = std::make_shared<EarlyTimeouts>(memory);
  auto config = JoinConfig(6, 6);
  config.layout_grace = 200ms;
  ASSERT_EQ(StalledJoin(*memory, 0, 8), 1);
  ASSERT_EQ(StalledJoin(*memory, 0, 9), 2);
  ASSERT_TRUE(memory->Set("rdzv/test/r0/publisher", "2", Deadline::AfterMs(5000)).ok());
  testing::RendezvousLog log;
  EXPECT_EQ(FormedRanks(JoinAll(store, config, 4), 6, "host8"), (std::set<int>{2, 3, 4, 5}));
  EXPECT_EQ(store->record_reads, 1) << "more than one node read the N records";
  EXPECT_TRUE(log.Said(std::regex(R"(slot 1 did not publish the layout \(nor slot 2, which)")));
}

// Nodes that take over from a stalled slot 1 on a loaded store (etcd at 10,000 nodes): a
// request that times out (the closing, the last call's read, the publisher's claim, the
// layout's write) is made again, it does not end the node.
TEST(RendezvousPublishTest, NodesTakingOverThroughStoreTimeoutsStillFormTheRound) {
  auto memory = std::make_shared<store::MemoryStore>();
  auto store = std::make_shared<EarlyTimeouts>(memory);
  store->TimeOutOnce({"rdzv/test/r0/closed", "rdzv/test/r0/publisher", "rdzv/test/r0/layout"});
  auto config = JoinConfig(3, 8);  // elastic: the last call's read of `closed`, then a count
  config.layout_grace = 200ms;
  config.last_call = 100ms;
  ASSERT_EQ(StalledJoin(*memory, 0, 9), 1);
  EXPECT_EQ(FormedRanks(JoinAll(store, config, 5), 6, "host9"), (std::set<int>{1, 2, 3, 4, 5}));
  EXPECT_GE(store->injected.load(), 5) << "the takeover met no timeout";
  EXPECT_EQ(store->record_reads, 1) << "more than one node read the N records";
}

// A quiet round's nodes learn its end up to a beat period apart, so the next round fills
// over that long at least: its nodes give slot 1 the layout grace plus that period before
// they take over (at 10,000 nodes on etcd, 30 s + 20 s; with 30 s alone the first joiners
// took over from a slot 1 that was only waiting for the late learners).
TEST(RendezvousPublishTest, AfterAQuietRoundSlotOneGetsTheGracePlusItsBeatPeriod) {
  auto memory = std::make_shared<store::MemoryStore>();
  auto store = std::make_shared<EarlyTimeouts>(memory);
  store->OfferIdle();
  auto config = JoinConfig(2, 3);
  config.quiet_start_nodes = 2;
  config.quiet_beats_per_s = 4;  // two nodes: a beat period of 500 ms
  config.layout_grace = 100ms;
  std::vector<std::unique_ptr<Rendezvous>> nodes;
  for (int i = 0; i < 2; ++i) {
    nodes.push_back(std::make_unique<Rendezvous>(store, config, ScenarioNode(i)));
  }
  std::vector<std::optional<Result<RendezvousInfo>>> first(2);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { first[i] = nodes[i]->Next(); });
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(first[i]->ok()) << first[i]->status().ToString();
    ASSERT_EQ((*first[i])->group_world_size, 2);
    auto step = nodes[i]->WatchStep(**first[i]);  // the first step of a quiet round: rests
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    ASSERT_FALSE(step->has_value());
    ASSERT_GT(nodes[i]->DeadTimeout(**first[i]), config.dead_timeout) << "the round is not quiet";
  }
  ASSERT_TRUE(nodes[0]->EndRound(0, {RoundEnd::Kind::kJoin, "host9"}, nullptr).ok());
  // Round 1's slot 1 joins and then never gets further.
  ASSERT_EQ(StalledJoin(*memory, 1, 9), 1);
  std::vector<std::optional<Result<RendezvousInfo>>> second(2);
  std::vector<double> took(2);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        const auto start = SteadyClock::now();
        second[i] = nodes[i]->Next();
        took[i] = SecondsSince(start);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(second[i]->ok()) << second[i]->status().ToString();
    EXPECT_EQ((*second[i])->round, 1);
    EXPECT_EQ((*second[i])->group_world_size, 3);
    EXPECT_EQ((*second[i])->master.host, "host9");
    // Taking over means at least one grace (two for the node that did not publish): 600 ms
    // each, where the layout grace alone is 100 ms.
    EXPECT_GE(took[i], 0.6) << "node " << i << " took over before the grace and the period";
  }
  EXPECT_EQ(store->record_reads, 1) << "more than one node read the N records";
}

}  // namespace
}  // namespace cohort::rendezvous
