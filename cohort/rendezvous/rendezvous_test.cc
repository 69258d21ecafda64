// Rendezvous tests: agents as threads over one MemoryStore (over an embedded StoreServer
// where a test needs what only it does: wills).
#include "cohort/rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <set>
#include <thread>

#include "cohort/base/mutex.h"
#include "cohort/rendezvous/early_timeouts.h"
#include "cohort/rendezvous/loss_scenario.h"
#include "cohort/store/memory_store.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tcp_store.h"

namespace cohort::rendezvous {
namespace {

using namespace std::chrono_literals;
using testing::EarlyTimeouts;
using testing::JoinAll;

RendezvousConfig Config(int min_nodes, int max_nodes) {
  return testing::JoinConfig(min_nodes, max_nodes);
}

NodeInfo Node(int i) { return testing::ScenarioNode(i); }

// `n` agents over `store`, each on a Rendezvous of its own (used by one thread at a time).
std::vector<std::unique_ptr<Rendezvous>> Agents(std::shared_ptr<store::Store> store,
                                                const RendezvousConfig& config, int n) {
  std::vector<std::unique_ptr<Rendezvous>> nodes;
  for (int i = 0; i < n; ++i) nodes.push_back(std::make_unique<Rendezvous>(store, config, Node(i)));
  return nodes;
}

// Next() on every agent at once; their results in agent order.
std::vector<Result<RendezvousInfo>> NextOnEach(std::vector<std::unique_ptr<Rendezvous>>& nodes) {
  std::vector<std::optional<Result<RendezvousInfo>>> results(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = nodes[i]->Next(); });
  }
  for (auto& t : threads) t.join();
  std::vector<Result<RendezvousInfo>> out;
  for (auto& r : results) out.push_back(std::move(*r));
  return out;
}

TEST(RendezvousTest, TwoHundredFiftySixAgentsJoinAtOnce) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kAgents = 256;
  auto start = SteadyClock::now();
  auto results = JoinAll(store, Config(kAgents, kAgents), kAgents);
  std::set<int> ranks;
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->round, 0);
    EXPECT_EQ(r->group_world_size, kAgents);
    EXPECT_EQ(r->WorldSize(), 2 * kAgents);
    EXPECT_EQ(r->RankOffset(), 2 * r->group_rank);
    ranks.insert(r->group_rank);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(kAgents));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), kAgents - 1);
  EXPECT_LT(SecondsSince(start), 10.0);
}

TEST(RendezvousTest, MixedLocalWorldSizesGetDenseRanks) {
  auto store = std::make_shared<store::MemoryStore>();
  constexpr int kAgents = 7;
  auto config = Config(kAgents, kAgents);
  std::vector<std::optional<Result<RendezvousInfo>>> results(kAgents);
  std::vector<int> sizes(kAgents);
  std::vector<std::thread> threads;
  for (int i = 0; i < kAgents; ++i) {
    sizes[i] = i % 3 + 1;
    threads.emplace_back([&, i] {
      NodeInfo self = Node(i);
      self.local_world_size = sizes[i];
      results[i] = Rendezvous(store, config, self).Next();
    });
  }
  for (auto& t : threads) t.join();
  // Every global rank 0..world-1 belongs to exactly one node, in group-rank order.
  std::vector<int> owner(1 + 2 + 3 + 1 + 2 + 3 + 1, -1);
  std::vector<int> offset_by_group_rank(kAgents, -1);
  for (int i = 0; i < kAgents; ++i) {
    ASSERT_TRUE(results[i]->ok()) << results[i]->status().ToString();
    const RendezvousInfo& info = **results[i];
    EXPECT_EQ(info.WorldSize(), static_cast<int>(owner.size()));
    EXPECT_EQ(info.master.host, "host" + std::to_string(
        std::find_if(results.begin(), results.end(), [](auto& r) { return (*r)->group_rank == 0; }) -
        results.begin()));
    offset_by_group_rank[info.group_rank] = info.RankOffset();
    for (int k = 0; k < sizes[i]; ++k) {
      ASSERT_LT(info.RankOffset() + k, static_cast<int>(owner.size()));
      EXPECT_EQ(owner[info.RankOffset() + k], -1) << "rank given twice";
      owner[info.RankOffset() + k] = i;
    }
  }
  for (int o : owner) EXPECT_NE(o, -1);
  EXPECT_TRUE(std::is_sorted(offset_by_group_rank.begin(), offset_by_group_rank.end()));
}

TEST(RendezvousTest, RoundLayoutRoundTripsAndRefusesGarbage) {
  std::vector<NodeInfo> nodes(5);
  for (int i = 0; i < 5; ++i) nodes[i].local_world_size = i < 3 ? 8 : 4;
  RoundLayout layout = RoundLayout::FromNodes(nodes);
  EXPECT_EQ(layout.Encode(), "5:8x3,4x2");
  auto back = RoundLayout::Decode(layout.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->WorldSize(), 32);
  EXPECT_EQ(back->RankOffset(0), 0);
  EXPECT_EQ(back->RankOffset(3), 24);
  EXPECT_EQ(back->RankOffset(4), 28);
  for (const char* bad : {"", "5", "5:", "5:8x3", "x:8x5", "5:8x3,4", "5:0x5", "2:8x3"}) {
    EXPECT_FALSE(RoundLayout::Decode(bad).ok()) << bad;
  }
}

TEST(RendezvousTest, OthersPublishTheLayoutWhenSlotOneStalls) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(3, 3);
  config.layout_grace = 200ms;
  // Slot 1 joins (ticket and record) and then never gets further.
  const Deadline d = Deadline::AfterMs(5000);
  ASSERT_EQ(*store->TakeTicket("rdzv/test/r0/slot", d), 1);
  ASSERT_TRUE(store->MultiSet({"rdzv/test/r0/node1", "rdzv/test/r0/hb1"},
                              {Node(9).ToJson(), "0"}, d).ok());
  auto results = JoinAll(store, config, 2);
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->WorldSize(), 6);
    EXPECT_EQ(r->master.host, "host9");
    EXPECT_EQ(r->RankOffset(), 2 * r->group_rank);
  }
}

// The requests that end a round are sent again when a loaded store times them out (here:
// the claim, the failure record and `next`, each once, not applied): the end is written,
// not lost to an error on the node that found it.
TEST(RendezvousTest, AnEndWhoseRequestsTimeOutOnceIsStillWritten) {
  auto store = std::make_shared<EarlyTimeouts>(std::make_shared<store::MemoryStore>());
  auto nodes = Agents(store, Config(2, 2), 2);
  for (auto& info : NextOnEach(nodes)) ASSERT_TRUE(info.ok()) << info.status().ToString();
  // Each request of the end times out once unanswered (the restart count's read and its
  // compare-and-set too), and the count's compare-and-set once more after it was applied:
  // sent again, it must not count the failure twice.
  store->TimeOutOnce({"rdzv/test/r0/ended_by", "rdzv/test/r0/failure", "rdzv/test/r0/next",
                      "rdzv/test/restarts"});
  store->LoseAnswerOnce({"rdzv/test/restarts"});
  FailureRecord failure{0, "host0", 1, 0, "boom"};
  auto won = nodes[0]->EndRound(0, {RoundEnd::Kind::kFailure, "rank 0"}, &failure);
  ASSERT_TRUE(won.ok()) << won.status().ToString();
  EXPECT_TRUE(*won);
  EXPECT_EQ(store->injected.load(), 6);
  auto next = store->Get("rdzv/test/r0/next", Deadline::After(5s));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(RoundEnd::Decode(*next).kind, RoundEnd::Kind::kFailure);
  auto restarts = store->Get("rdzv/test/restarts", Deadline::After(5s));
  ASSERT_TRUE(restarts.ok());
  EXPECT_EQ(*restarts, "1@0") << "one restart counted, by round 0's end";
}

// A claim of round 0's end whose `next` never comes (its node died after claiming, before
// counting): two nodes that find a failure lose the claim to it, and past the layout grace
// exactly one of them takes it over; both return once `next` is written, the failure
// counted once.
TEST(RendezvousTest, TwoLosersOfAStaleClaimAgreeOnOneTakerAndOneEnd) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(3, 3);
  config.layout_grace = 300ms;
  auto nodes = Agents(store, config, 3);
  for (auto& info : NextOnEach(nodes)) ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_TRUE(store->Set("rdzv/test/r0/ended_by", "failure:rank 5#0dead", Deadline::After(5s)).ok());
  std::vector<std::optional<Result<bool>>> won(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      FailureRecord failure{i, "host" + std::to_string(i), 1, 0, "boom"};
      won[i] = nodes[i]->EndRound(0, {RoundEnd::Kind::kFailure, "rank " + std::to_string(i)},
                                  &failure);
    });
  }
  for (auto& t : threads) t.join();
  int winners = 0;
  for (auto& w : won) {
    ASSERT_TRUE(w->ok()) << w->status().ToString();
    winners += **w ? 1 : 0;
  }
  EXPECT_EQ(winners, 1);
  auto next = store->Get("rdzv/test/r0/next", Deadline::After(5s));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(RoundEnd::Decode(*next).kind, RoundEnd::Kind::kFailure);
  auto state = store->Peek({"rdzv/test/restarts", "rdzv/test/round"}, Deadline::After(5s));
  ASSERT_TRUE(state.ok());
  EXPECT_EQ((*state)[0], "1@0") << "one restart counted, by round 0's end";
  EXPECT_EQ((*state)[1], "1") << "the round counter moved on";
  // The round that follows forms as after any end.
  for (auto& info : NextOnEach(nodes)) {
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->round, 1);
    EXPECT_EQ(info->restart_count, 1);
  }
}

TEST(RendezvousTest, ElasticRoundClosesAfterLastCall) {
  auto store = std::make_shared<store::MemoryStore>();
  auto results = JoinAll(store, Config(2, 4), 3);
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->group_world_size, 3);
  }
}

TEST(RendezvousTest, JoinTimeoutNamesTheShortfall) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(2, 2);
  config.join_timeout = 200ms;
  Rendezvous r(store, config, Node(0));
  auto start = SteadyClock::now();
  auto info = r.Next();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(info.status().message().find("1 of the minimum 2"), std::string::npos)
      << info.status().message();
  EXPECT_LT(SecondsSince(start), 5.0);
}

TEST(RendezvousTest, LateJoinerTriggersLargerRoundWithoutSpendingBudget) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(2, 3);
  config.last_call = 50ms;
  auto first = JoinAll(store, config, 2);
  for (auto& r : first) ASSERT_TRUE(r.ok());
  ASSERT_EQ(first[0]->group_world_size, 2);

  // Agents 0 and 1 watch the running round; agent 2 arrives late.
  std::vector<std::optional<Result<RendezvousInfo>>> second(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      Rendezvous r(store, config, Node(i));
      for (;;) {
        auto ended = r.WatchStep(*first[i]);
        ASSERT_TRUE(ended.ok()) << ended.status().ToString();
        if (ended->has_value()) {
          EXPECT_EQ((*ended)->kind, RoundEnd::Kind::kJoin) << (*ended)->Encode();
          EXPECT_EQ((*ended)->detail, "host2") << (*ended)->Encode();
          break;
        }
      }
      second[i] = r.Next();
    });
  }
  threads.emplace_back([&] {
    Rendezvous r(store, config, Node(2));
    second[2] = r.Next();
  });
  for (auto& t : threads) t.join();
  for (auto& r : second) {
    ASSERT_TRUE(r->ok()) << r->status().ToString();
    EXPECT_EQ((*r)->round, 1);
    EXPECT_EQ((*r)->group_world_size, 3);
    EXPECT_EQ((*r)->restart_count, 0);
  }
}

TEST(RendezvousTest, SilentNodeIsDeclaredDead) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(2, 2);
  auto infos = JoinAll(store, config, 2);
  for (auto& r : infos) ASSERT_TRUE(r.ok());
  // Node 0 keeps watching; node 1 never sends a heartbeat (it "died").
  int watcher = infos[0]->slot == 1 ? 0 : 1;
  Rendezvous r(store, config, Node(watcher));
  auto start = SteadyClock::now();
  std::optional<RoundEnd> ended;
  while (!ended) {
    auto step = r.WatchStep(*infos[watcher]);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    ended = *step;
    ASSERT_LT(SecondsSince(start), 10.0) << "dead node not detected";
  }
  EXPECT_EQ(ended->kind, RoundEnd::Kind::kDeadNode) << ended->Encode();
  EXPECT_TRUE(ended->CountsAsFailure());
  EXPECT_GE(SecondsSince(start), 0.25);
  auto failure = r.GetFailure(infos[watcher]->round);
  ASSERT_TRUE(failure.ok());
  EXPECT_NE(failure->message.find("heartbeats"), std::string::npos);
}

TEST(RendezvousTest, FinishedNodeIsNotDead) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(2, 2);
  auto infos = JoinAll(store, config, 2);
  for (auto& r : infos) ASSERT_TRUE(r.ok());
  Rendezvous finisher(store, config, Node(1));
  ASSERT_TRUE(finisher.MarkFinished(*infos[1]).ok());
  Rendezvous r(store, config, Node(0));
  auto start = SteadyClock::now();
  while (SecondsSince(start) < 0.6) {
    auto step = r.WatchStep(*infos[0]);
    ASSERT_TRUE(step.ok());
    ASSERT_FALSE(step->has_value()) << (*step)->Encode();
  }
}

TEST(RendezvousTest, SilentNodeBehindFinishedNodesIsFound) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(5, 5);
  auto infos = JoinAll(store, config, 5);
  std::vector<const RendezvousInfo*> by_slot(6, nullptr);
  for (auto& r : infos) {
    ASSERT_TRUE(r.ok());
    by_slot[r->slot] = &*r;
  }
  // Slots 2 and 3 finished; slot 4 is silent; slot 1 watches (its successor is slot 2).
  for (int slot : {2, 3}) {
    ASSERT_TRUE(Rendezvous(store, config, Node(slot)).MarkFinished(*by_slot[slot]).ok());
  }
  Rendezvous r(store, config, Node(0));
  auto start = SteadyClock::now();
  std::optional<RoundEnd> ended;
  while (!ended) {
    auto step = r.WatchStep(*by_slot[1]);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    ended = *step;
    ASSERT_LT(SecondsSince(start), 10.0) << "silent node not detected";
  }
  EXPECT_EQ(ended->kind, RoundEnd::Kind::kDeadNode);
  EXPECT_NE(ended->detail.find("node 3 ("), std::string::npos) << ended->detail;
  EXPECT_GE(SecondsSince(start), 0.3);
}

// On a store that keeps wills, a node whose connection ends is known gone one liveness
// period later (not after the dead timeout of silence), with the store's word for why; a
// node that finished first is not.
TEST(RendezvousTest, EndedConnectionIsToldByItsWillAndFinishedNodesAreNot) {
  const std::string token = "rendezvous-test";
  auto server = store::StoreServer::Start({.host = "127.0.0.1", .port = 0, .token = token});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto connect = [&]() -> std::shared_ptr<store::Store> {
    auto c = store::TcpStore::Connect(
        {.host = "127.0.0.1", .port = (*server)->port(), .token = token}, Deadline::AfterMs(5000));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::shared_ptr<store::Store>(std::move(c).value()) : nullptr;
  };
  auto config = Config(3, 3);
  config.heartbeat_interval = 100ms;
  config.dead_timeout = 3s;  // liveness period and will grace: 1 s
  auto infos = JoinAll(connect, config, 3);
  std::vector<const RendezvousInfo*> by_slot(4, nullptr);
  for (auto& r : infos) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    by_slot[r->slot] = &*r;
  }
  // Slot 2 takes a step, which leaves its will; its grace is shorter than slot 1's steps
  // (its liveness period: 1 s / 3), so the will can wake a step of slot 1 that read slot
  // 2's counter before slot 2 finished.
  auto config2 = config;
  config2.dead_timeout = 1s;
  auto s2 = connect();
  Rendezvous r2(s2, config2, Node(2));
  auto step2 = r2.WatchStep(*by_slot[2]);
  ASSERT_TRUE(step2.ok() && !*step2);
  // Slot 1 watches slot 2 from now on.
  const int64_t beats_before = (*server)->stats().beats;
  std::promise<Result<std::optional<RoundEnd>>> ended1;
  std::thread t1([&] {
    Rendezvous r1(connect(), config, Node(1));
    for (;;) {
      auto step = r1.WatchStep(*by_slot[1]);
      if (!step.ok() || *step) {
        ended1.set_value(std::move(step));
        return;
      }
    }
  });
  // Its second step (a whole liveness period, 1 s) has begun: it holds slot 2's counter
  // as it was before slot 2 finishes.
  auto probe = connect();
  for (auto until = Deadline::AfterMs(20000); (*server)->stats().beats < beats_before + 2;) {
    ASSERT_FALSE(until.expired());
    ASSERT_EQ(probe->Wait({"never"}, Deadline::AfterMs(5)).code(), StatusCode::kDeadlineExceeded);
  }
  // Slot 3 watches and beats on its own connection until it is cut.
  auto s3 = connect();
  std::thread t3([&] {
    Rendezvous r3(s3, config, Node(3));
    for (;;) {
      auto step = r3.WatchStep(*by_slot[3]);
      if (!step.ok() || *step) return;
    }
  });
  auto ended_future = ended1.get_future();
  // Slot 2 finishes, then its connection ends: its will fires while slot 1's step waits,
  // with the counter that step read before slot 2 finished. Slot 1 must pass over it (to
  // slot 3, which beats), not take it for dead.
  ASSERT_TRUE(r2.MarkFinished(*by_slot[2]).ok());
  s2->Abort();
  EXPECT_EQ(ended_future.wait_for(2500ms), std::future_status::timeout)
      << "the round ended for a node that finished";
  EXPECT_GE((*server)->stats().wills_fired, 1);
  s3->Abort();  // its connection ends, as when the process dies
  t3.join();
  ASSERT_EQ(ended_future.wait_for(20s), std::future_status::ready)
      << "the ended connection was not noticed";
  t1.join();
  auto result = ended_future.get();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  std::optional<RoundEnd> ended = *result;
  EXPECT_EQ(ended->kind, RoundEnd::Kind::kDeadNode);
  EXPECT_NE(ended->detail.find("node 2 ("), std::string::npos) << ended->detail;
  EXPECT_NE(ended->detail.find("): its store connection closed"), std::string::npos)
      << "not told by the will: " << ended->detail;
  EXPECT_EQ((*server)->stats().wills_fired, 2);
}

TEST(RendezvousTest, FailuresSpendTheJobWideBudgetOnce) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(2, 2);
  config.max_restarts = 1;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto infos = JoinAll(store, config, 2);
    for (auto& r : infos) ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(infos[0]->restart_count, attempt);
    // Both nodes report the failure; it counts once.
    FailureRecord f;
    f.rank = 3;
    f.exit_code = 1;
    f.message = "boom";
    std::atomic<int> winners{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        Rendezvous r(store, config, Node(i));
        auto won = r.EndRound(infos[i]->round, RoundEnd{RoundEnd::Kind::kFailure, "rank 3"}, &f);
        ASSERT_TRUE(won.ok());
        if (*won) winners++;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(winners, 1);
  }
  Rendezvous r(store, config, Node(0));
  auto next = r.Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(next.status().message().find("restart budget"), std::string::npos);
  auto failure = r.GetFailure(1);
  ASSERT_TRUE(failure.ok());
  EXPECT_EQ(failure->Describe(), "rank 3 (host ) exited with code 1: boom");
}

TEST(RendezvousTest, SpareReplacesFailedNode) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(2, 2);
  std::optional<Result<RendezvousInfo>> spare_result;
  auto first = JoinAll(store, config, 2);
  for (auto& r : first) ASSERT_TRUE(r.ok());
  std::thread spare([&] {
    Rendezvous r(store, config, Node(9));
    spare_result = r.Next();  // waits: round 0 is full
  });
  // Node of slot 2 fails; the survivor and the spare form round 1.
  Rendezvous survivor(store, config, Node(0));
  FailureRecord f;
  ASSERT_TRUE(survivor.EndRound(0, RoundEnd{RoundEnd::Kind::kFailure, "node died"}, &f).ok());
  auto next = survivor.Next();
  spare.join();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ASSERT_TRUE(spare_result->ok()) << spare_result->status().ToString();
  EXPECT_EQ(next->round, 1);
  EXPECT_EQ((*spare_result)->round, 1);
  EXPECT_EQ(next->group_world_size, 2);
}

TEST(RendezvousTest, ClosedJobRefusesJoinsAndWakesSpares) {
  auto store = std::make_shared<store::MemoryStore>();
  auto config = Config(1, 1);
  auto first = JoinAll(store, config, 1);
  ASSERT_TRUE(first[0].ok());
  std::optional<Result<RendezvousInfo>> spare_result;
  std::thread spare([&] {
    Rendezvous r(store, config, Node(5));
    spare_result = r.Next();
  });
  Rendezvous owner(store, config, Node(0));
  ASSERT_TRUE(owner.CloseJob("succeeded").ok());
  spare.join();
  ASSERT_FALSE(spare_result->ok());
  EXPECT_EQ(spare_result->status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cohort::rendezvous

namespace cohort::rendezvous {
namespace {

// A round ended for a lost node expects the others: the next round closes as soon as they
// joined, not after the last call (here a minute, longer than the test's own deadline).
TEST(RendezvousTest, TheNextRoundClosesOnceTheExpectedNodesJoined) {
  auto store = std::make_shared<store::MemoryStore>();
  RendezvousConfig c = Config(3, 3);  // the first round: all three, closed at once
  c.last_call = std::chrono::seconds(60);
  auto first = JoinAll(store, c, 3);
  for (auto& r : first) ASSERT_TRUE(r.ok()) << r.status().ToString();
  Rendezvous ender(store, c, Node(0));
  ASSERT_TRUE(ender.EndRound(0, RoundEnd{RoundEnd::Kind::kDeadNode, "node 2 lost"}, nullptr,
                             /*expect_next=*/2)
                  .ok());
  c.min_nodes = 2;
  const auto start = SteadyClock::now();
  auto second = JoinAll(store, c, 2);
  for (auto& r : second) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->round, 1);
    EXPECT_EQ(r->group_world_size, 2);
  }
  EXPECT_LT(SecondsSince(start), 30.0);
}

}  // namespace
}  // namespace cohort::rendezvous

namespace cohort::rendezvous {
namespace {

// A warm spare (standby) joins no running round; at a node loss it takes the place in the
// next round, which waits for it (the last call here is a minute: the round closes on the
// expected count the spare raised).
// Round 0 of MAX = 3 nodes is running and a warm spare (node 9) watches it: Next() of a
// standby Rendezvous on its own thread.
class WarmSpare {
 public:
  WarmSpare(std::shared_ptr<store::MemoryStore> store, RendezvousConfig config)
      : store_(std::move(store)), config_(config) {
    auto first = JoinAll(store_, config, 3);  // MAX joined: round 0 closes at once
    for (auto& r : first) EXPECT_TRUE(r.ok()) << r.status().ToString();
    config.standby = true;
    thread_ = std::thread([this, config] {
      Rendezvous r(store_, config, Node(9));
      result_ = r.Next();
    });
  }
  ~WarmSpare() {  // a test that stopped early: closing the job wakes the spare
    if (!thread_.joinable()) return;
    (void)Rendezvous(store_, config_, Node(0)).CloseJob("the test ended");
    thread_.join();
  }
  // The spare counts itself once it watches round 0: from then on it sees how it ends.
  bool Watching() { return store_->Wait({"rdzv/test/standby"}, Deadline::AfterMs(20000)).ok(); }
  const Result<RendezvousInfo>& Join() {
    thread_.join();
    return *result_;
  }

 private:
  std::shared_ptr<store::MemoryStore> store_;
  const RendezvousConfig config_;
  std::optional<Result<RendezvousInfo>> result_;
  std::thread thread_;
};

TEST(RendezvousTest, AWarmSpareTakesALostNodesPlace) {
  auto store = std::make_shared<store::MemoryStore>();
  RendezvousConfig c = Config(2, 3);
  c.last_call = std::chrono::seconds(60);
  WarmSpare spare(store, c);
  ASSERT_TRUE(spare.Watching());
  Rendezvous ender(store, c, Node(0));
  ASSERT_TRUE(ender.EndRound(0, RoundEnd{RoundEnd::Kind::kDeadNode, "node 2 lost"}, nullptr,
                             /*expect_next=*/2)
                  .ok());
  const auto start = SteadyClock::now();
  // The survivors of a real job come back after stopping their workers, long after the
  // spare counted itself in round 1's `expect`; here they wait for that count. (Had they
  // closed round 1 first, the spare would find it running with room and ask for a
  // re-rendezvous: round 2 with all three, one restart later.)
  const Deadline counted = Deadline::AfterMs(20000);
  for (;;) {  // polled (MemoryStore has no wait for a value): ends when the count is 3
    auto expect = store->Get("rdzv/test/r1/expect", counted);
    ASSERT_TRUE(expect.ok()) << expect.status().ToString();
    if (*expect == "3") break;
    ASSERT_FALSE(counted.expired()) << "the spare never counted itself: expect " << *expect;
    std::this_thread::yield();
  }
  auto survivors = JoinAll(store, c, 2);
  const auto& admitted = spare.Join();
  ASSERT_TRUE(admitted.ok()) << admitted.status().ToString();
  EXPECT_EQ(admitted->round, 1);
  EXPECT_EQ(admitted->group_world_size, 3);
  for (auto& r : survivors) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->round, 1);
    EXPECT_EQ(r->group_world_size, 3);
    EXPECT_LT(r->slot, admitted->slot);  // behind the survivors
  }
  EXPECT_LT(SecondsSince(start), 30.0);
}

// A round that ends otherwise (a failure: every node comes back) is not the spare's: the
// nodes form the next round without it, and it waits on (here until the job is closed).
TEST(RendezvousTest, AWarmSpareLeavesARestartedRoundToItsNodes) {
  auto store = std::make_shared<store::MemoryStore>();
  RendezvousConfig c = Config(2, 3);
  WarmSpare spare(store, c);
  ASSERT_TRUE(spare.Watching());
  Rendezvous ender(store, c, Node(0));
  FailureRecord f;
  ASSERT_TRUE(ender.EndRound(0, RoundEnd{RoundEnd::Kind::kFailure, "rank 1"}, &f,
                             /*expect_next=*/3)
                  .ok());
  auto again = JoinAll(store, c, 3);
  for (auto& r : again) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->round, 1);
    EXPECT_EQ(r->group_world_size, 3);
  }
  ASSERT_TRUE(ender.CloseJob("succeeded").ok());
  const auto& refused = spare.Join();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cohort::rendezvous
