// Told ends on a real etcd (Debian etcd-server, one member started here on free loopback
// ports, SIGKILLed at the end; skipped when etcd is not installed): a quiet round whose
// nodes hold no watch of its end (quiet_watch_max_nodes 0) learns the end from the
// datagram of the node that wrote it (tell_start_nodes), not at a beat: each node's beat
// period here is 100 s, and no node beats before it learns either end (a failure, then a
// lost node in the round after, carried though young). Without the datagrams they would
// learn it at their first beat, 10-100 s in.
#include <gtest/gtest.h>

#include <thread>

#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/etcd_test_util.h"

namespace cohort::store::etcd_test {
namespace {

using rendezvous::RoundEnd;

class ToldEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kEtcd)) GTEST_SKIP() << kEtcd << " is not installed";
    std::string error;
    ASSERT_TRUE(cluster_.Start(1, {}, &error)) << error;
  }
  std::shared_ptr<Store> Make() { return Connect(cluster_.Endpoints(), "told"); }

  EtcdCluster cluster_;
};

// Every node but `ender` watches `infos`' round until it ends; `end` runs once they watch.
// Returns how each saw the round end.
std::vector<std::optional<RoundEnd>> WatchWhile(
    const std::vector<std::unique_ptr<rendezvous::Rendezvous>>& watchers,
    const std::vector<rendezvous::RendezvousInfo>& infos, int ender,
    const std::function<void()>& end) {
  std::vector<std::optional<RoundEnd>> ended(watchers.size());
  std::vector<std::thread> threads;
  const Deadline give_up = Deadline::After(60s);
  for (size_t i = 0; i < watchers.size(); ++i) {
    if (static_cast<int>(i) == ender) continue;
    threads.emplace_back([&, i] {
      while (!ended[i] && !give_up.expired()) {
        auto step = watchers[i]->WatchStep(infos[i]);
        if (!step.ok()) return;
        ended[i] = *step;
      }
    });
  }
  end();
  for (auto& t : threads) t.join();
  return ended;
}

TEST_F(ToldEndTest, AQuietRoundWithoutHeldWatchesIsToldItsEndByDatagram) {
  rendezvous::RendezvousConfig c;
  c.run_id = "told";
  c.min_nodes = 2;  // a round of 2 may be carried from one of 3
  c.max_nodes = 3;
  c.join_timeout = 30s;
  c.max_restarts = 5;
  c.heartbeat_interval = 100ms;
  c.dead_timeout = 400s;  // a beat every 100 s, the first after 10-100 s
  c.quiet_start_nodes = 3;
  c.quiet_watch_max_nodes = 0;  // no held watch: without a datagram, the end waits for a beat
  c.tell_start_nodes = 3;
  c.carry_start_nodes = 3;
  std::vector<std::unique_ptr<rendezvous::Rendezvous>> nodes, watchers;
  std::vector<std::shared_ptr<rendezvous::RoundTell>> tells;
  for (int i = 0; i < 3; ++i) {
    rendezvous::NodeInfo self{"host" + std::to_string(i), "127.0.0.1", 1, ""};
    auto tell = rendezvous::RoundTell::Open();
    ASSERT_TRUE(tell.ok()) << tell.status().ToString();
    tells.push_back(*tell);
    nodes.push_back(std::make_unique<rendezvous::Rendezvous>(Make(), c, self));
    nodes.back()->UseTell(*tell);
    watchers.push_back(std::make_unique<rendezvous::Rendezvous>(Make(), c, self));
    watchers.back()->UseTell(*tell);
  }
  auto form = [&] {
    std::vector<std::optional<Result<rendezvous::RendezvousInfo>>> got(3);
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) threads.emplace_back([&, i] { got[i] = nodes[i]->Next(); });
    for (auto& t : threads) t.join();
    std::vector<rendezvous::RendezvousInfo> infos;
    for (auto& g : got) {
      EXPECT_TRUE(g && g->ok()) << (g ? g->status().ToString() : "no round");
      if (g && g->ok()) infos.push_back(**g);
    }
    return infos;
  };
  auto beats = [&](int64_t round) {
    auto now = Make()->Peek({fmt::format("rdzv/told/r{}/hb1", round),
                             fmt::format("rdzv/told/r{}/hb2", round),
                             fmt::format("rdzv/told/r{}/hb3", round)},
                            Soon());
    EXPECT_TRUE(now.ok());
    return now.ok() ? *now : std::vector<std::optional<std::string>>();
  };

  // Round 0 ends for a failure that node 0 reports.
  auto round0 = form();
  ASSERT_EQ(round0.size(), 3u);
  for (const auto& info : round0) {
    EXPECT_EQ(info.group_world_size, 3);
    EXPECT_EQ(info.tell_key.size(), 32u);
    EXPECT_EQ(info.tell_key, round0[0].tell_key);  // one key, slot 1's, read with the layout
  }
  rendezvous::FailureRecord failure{0, "host0", 1, 0, "boom"};
  auto ended = WatchWhile(watchers, round0, 0, [&] {
    auto won = nodes[0]->EndRound(round0[0], {RoundEnd::Kind::kFailure, "rank 0"}, &failure, 3);
    ASSERT_TRUE(won.ok() && *won) << won.status().ToString();
  });
  for (int i = 1; i < 3; ++i) {
    ASSERT_TRUE(ended[i].has_value()) << "node " << i << " was not told";
    EXPECT_EQ(ended[i]->kind, RoundEnd::Kind::kFailure);
  }
  for (const auto& beat : beats(0)) EXPECT_FALSE(beat) << "a node beat before it learned the end";

  // Round 1 (joined again: a new key) loses node 2, which node 0's workers found. (Node 0's
  // etcd client dates writes by its answers' revisions, sampled every 100 ms: round 1 is
  // formed after its first sample's window closed, as any round but a test's is.)
  const auto first_answer = SteadyClock::now();
  while (SteadyClock::now() - first_answer < 300ms) {
    ASSERT_TRUE(nodes[0]->store().Peek({"x"}, Soon()).ok());
  }
  auto round1 = form();
  ASSERT_EQ(round1.size(), 3u);
  EXPECT_EQ(round1[0].round, 1);
  EXPECT_NE(round1[0].tell_key, round0[0].tell_key);
  rendezvous::FailureRecord lost;
  lost.host = "host0";
  lost.message = "lost node 2";
  ended = WatchWhile(watchers, round1, 0, [&] {
    auto won = nodes[0]->EndRoundForLostNode(round1[0], round1[2].slot,
                                             {RoundEnd::Kind::kDeadNode, "node 2 lost"}, lost);
    ASSERT_TRUE(won.ok() && *won) << won.status().ToString();
  });
  for (int i = 1; i < 3; ++i) {
    ASSERT_TRUE(ended[i].has_value()) << "node " << i << " was not told";
    EXPECT_EQ(ended[i]->kind, RoundEnd::Kind::kDeadNode);
    EXPECT_EQ(ended[i]->detail, "node 2 lost");
    // Carried, though the round is younger than two beat periods (200 s) and so is the
    // ender's etcd client: every key of the round was written after its first answer, so
    // etcd's revisions date them (Store::Silent); only node 2 is left out.
    EXPECT_TRUE(ended[i]->carried.has_value()) << "node " << i;
  }
  for (const auto& beat : beats(1)) EXPECT_FALSE(beat) << "a node beat before it learned the end";
  // Node 1 takes the carried round from the end it was told; node 0 wrote it.
  nodes[1]->Told(1, *ended[1]);
  for (int i = 0; i < 2; ++i) {
    auto next = nodes[i]->Next();
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    EXPECT_EQ(next->round, 2);
    EXPECT_EQ(next->group_world_size, 2);
    EXPECT_EQ(next->carried.records_round, 1);
    EXPECT_EQ(next->carried.left_out, std::vector<int>{round1[2].slot});
    EXPECT_EQ(next->tell_key, round1[0].tell_key);  // a carried round keeps its key
  }
}

}  // namespace
}  // namespace cohort::store::etcd_test
