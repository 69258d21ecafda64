// EtcdStore tests against real etcd processes (Debian etcd-server, /usr/bin/etcd; the harness
// is etcd_test_util.h), started here with their data in a temp dir on free loopback ports and
// stopped by SIGKILL. Covers the Store contract (the cases of StoreContract in store_test.cc),
// prefixes, leases, the job directory and a rendezvous of 8 agents on etcd, retried joins,
// quiet rounds, liveness on leases (a silent node's lease ends the round), auth with token
// renewal, TLS with client certificates, failover across a
// 3-member cluster and a cluster without quorum. Skipped when etcd is not installed. The
// client without a real etcd (endpoints, stand-in gateways): etcd_client_test.cc.
#include "cohort/store/etcd_store.h"
#include "cohort/store/store_contract.h"

#include <curl/curl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "cohort/agent/job_directory.h"
#include "cohort/base/strings.h"
#include "cohort/rendezvous/loss_scenario.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/store/etcd_test_util.h"

namespace cohort::store::etcd_test {
namespace {

// One single-member cluster per test process (started on first use, killed at exit) for
// the contract cases and EtcdStoreTest; every store gets its own key prefix.
std::string shared_cluster_error;
EtcdCluster* SharedCluster() {
  static EtcdCluster* cluster = [] {
    static EtcdCluster c;
    return c.Start(1, {}, &shared_cluster_error) ? &c : nullptr;
  }();
  return cluster;
}

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kEtcd)) GTEST_SKIP() << kEtcd << " is not installed";
    ASSERT_NE(SharedCluster(), nullptr) << shared_cluster_error;
    prefix_ = "test-" + RandomHex(6);
    store_ = Make();
    ASSERT_NE(store_, nullptr);
  }
  std::shared_ptr<EtcdStore> Make() { return Connect(SharedCluster()->Endpoints(), prefix_); }

  // Three nodes ("host0".."host2"), each on its own store, join one round at once.
  struct Formed {
    std::vector<std::unique_ptr<rendezvous::Rendezvous>> nodes;
    std::vector<std::optional<Result<rendezvous::RendezvousInfo>>> infos;
  };
  Formed FormRoundOfThree(const rendezvous::RendezvousConfig& c) {
    Formed f;
    f.infos.resize(3);
    for (int i = 0; i < 3; ++i) {
      rendezvous::NodeInfo self{"host" + std::to_string(i), "10.0.0.1", 1, ""};
      f.nodes.push_back(std::make_unique<rendezvous::Rendezvous>(Make(), c, self));
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) threads.emplace_back([&f, i] { f.infos[i] = f.nodes[i]->Next(); });
    for (auto& t : threads) t.join();
    return f;
  }

  std::string prefix_;
  std::shared_ptr<EtcdStore> store_;
};

class EtcdFactory : public contract::StoreFactory {
 public:
  std::shared_ptr<Store> Make() override {
    return Connect(SharedCluster()->Endpoints(), prefix_);
  }

 private:
  std::string prefix_ = "contract-" + RandomHex(6);
};

using contract::StoreContract;
INSTANTIATE_TEST_SUITE_P(Etcd, StoreContract, ::testing::Values("etcd"),
                         [](const auto& info) { return info.param; });


// The Store contract (store_contract.h) runs against etcd too; this is what only etcd adds.
// The job's directory of metrics endpoints (agent/job_directory.h) works on etcd too:
// several agents publish at once, each gets its own entry, the end records are read back.
TEST_F(EtcdStoreTest, JobDirectoryOfMetricsEndpoints) {
  std::vector<std::thread> agents;
  std::vector<int> index(4, 0);
  for (int i = 0; i < 4; ++i) {
    agents.emplace_back([&, i] {
      auto own = Make();  // one connection per agent, as in a job
      auto got = agent::PublishEndpoint(*own, "job", {{"url", fmt::format("http://h{}:1/", i)}},
                                        Deadline::AfterMs(10000));
      if (got.ok()) index[i] = *got;
    });
  }
  for (auto& t : agents) t.join();
  std::vector<int> sorted = index;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{1, 2, 3, 4}));
  ASSERT_TRUE(agent::PublishEnd(*store_, "job", index[2], {{"state", "FAILED"}},
                                Deadline::AfterMs(5000)).ok());
  auto entries = agent::ReadDirectory(*store_, "job", Deadline::AfterMs(5000));
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 4u);
  for (const auto& e : *entries) {
    EXPECT_EQ(e.record["url"], fmt::format("http://h{}:1/", std::find(index.begin(), index.end(),
                                                                      e.index) - index.begin()));
    EXPECT_EQ(e.end.has_value(), e.index == index[2]);
  }
}

TEST_F(EtcdStoreTest, PrefixesAreNamespaces) {
  ASSERT_TRUE(store_->Set("a", "1", Soon()).ok());
  // Another prefix is another namespace; an empty value is still a key.
  auto other = Connect(SharedCluster()->Endpoints(), prefix_ + "x");
  EXPECT_EQ(*other->NumKeys(Soon()), 0);
  ASSERT_TRUE(other->Set("empty", "", Soon()).ok());
  EXPECT_EQ(*other->Get("empty", Soon()), "");
  EXPECT_EQ(*store_->NumKeys(Soon()), 1);
}

TEST_F(EtcdStoreTest, LeasedKeysVanishWithTheirClient) {
  EtcdStoreOptions o;
  o.endpoints = SharedCluster()->Endpoints();
  o.prefix = prefix_;
  o.lease_ttl = 2s;
  {
    auto leased = EtcdStore::Connect(o, Soon());
    ASSERT_TRUE(leased.ok()) << leased.status().ToString();
    EXPECT_NE((*leased)->lease_id(), 0);
    ASSERT_TRUE((*leased)->Set("alive", "1", Soon()).ok());
    ASSERT_TRUE((*leased)->MultiSet({"alive2"}, {"2"}, Soon()).ok());
    // Kept alive past its TTL by the background thread.
    std::this_thread::sleep_for(2500ms);
    EXPECT_TRUE(*store_->Check({"alive", "alive2"}, Soon()));
  }  // destruction revokes the lease
  EXPECT_FALSE(*store_->Check({"alive"}, Soon()));
  EXPECT_FALSE(*store_->Check({"alive2"}, Soon()));
}

TEST_F(EtcdStoreTest, UnreachableEndpointIsUnavailable) {
  EtcdStoreOptions o;
  o.endpoints = {fmt::format("127.0.0.1:{}", FreePort())};
  o.request_timeout = 1s;
  auto start = SteadyClock::now();
  auto s = EtcdStore::Connect(o, Soon());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
  EXPECT_LT(SecondsSince(start), 2.0);
  // A dead endpoint first in the list is skipped.
  o.endpoints.push_back(SharedCluster()->Endpoint(0));
  auto ok = EtcdStore::Connect(o, Soon());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE((*ok)->Set("x", "1", Soon()).ok());
}

TEST_F(EtcdStoreTest, EightAgentsCompleteARendezvous) {
  rendezvous::RendezvousConfig c;
  c.run_id = prefix_;
  c.min_nodes = c.max_nodes = 8;
  c.join_timeout = 20s;
  c.last_call = 200ms;
  c.heartbeat_interval = 100ms;
  c.dead_timeout = 2s;
  std::vector<std::optional<Result<rendezvous::RendezvousInfo>>> results(8);
  std::vector<std::thread> threads;
  auto start = SteadyClock::now();
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto s = Make();
      if (!s) return;
      rendezvous::NodeInfo self;
      self.host = "host" + std::to_string(i);
      self.addr = "10.0.0." + std::to_string(i);
      self.local_world_size = 2;
      rendezvous::Rendezvous r(s, c, self);
      results[i] = r.Next();
    });
  }
  for (auto& t : threads) t.join();
  std::set<int> ranks;
  for (auto& r : results) {
    ASSERT_TRUE(r.has_value());
    ASSERT_TRUE(r->ok()) << r->status().ToString();
    EXPECT_EQ((*r)->round, 0);
    EXPECT_EQ((*r)->group_world_size, 8);
    EXPECT_EQ((*r)->WorldSize(), 16);
    ranks.insert((*r)->group_rank);
  }
  EXPECT_EQ(ranks.size(), 8u);
  EXPECT_LT(SecondsSince(start), 10.0);
  std::printf("rendezvous of 8 agents on etcd: %.3f s\n", SecondsSince(start));
}

// A join sent again with the same token (its first call gave up, the txn was applied)
// gets the ticket it took, not a second one; another token takes the next ticket.
TEST_F(EtcdStoreTest, AJoinRetriedWithItsTokenTakesNoSecondTicket) {
  Store::JoinRequest join{"slot", "node", "me", {"closed"}, {"state"}, "token-1"};
  auto first = store_->Join(join, Soon());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto again = Make()->Join(join, Soon());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->ticket, first->ticket);
  EXPECT_EQ(*store_->CountTickets("slot", Soon()), 1);
  join.token = "token-2";
  join.record = "you";
  EXPECT_EQ(store_->Join(join, Soon())->ticket, 2);
  EXPECT_EQ(*store_->ReadAppended("slot", "node", 1, 2, Soon()),
            (std::vector<std::string>{"me", "you"}));
}

// A round of at least quiet_start_nodes on etcd starts quiet: a watcher's first step asks
// etcd nothing (it rests), so a round that ended before it is learned at the second step,
// by the beat that reads `next`; below that size the first step watches `next` and learns
// it at once. Either way every node learns the end and why.
TEST_F(EtcdStoreTest, AQuietRoundLearnsItsEndAtItsFirstBeat) {
  for (const bool quiet : {true, false}) {
    SCOPED_TRACE(quiet ? "quiet" : "watching");
    rendezvous::RendezvousConfig c;
    c.run_id = prefix_ + (quiet ? "-quiet" : "-watching");
    c.min_nodes = c.max_nodes = 3;
    c.join_timeout = 20s;
    c.heartbeat_interval = 100ms;
    // Quiet: beat period 500 ms, the first step rests 50-500 ms. Watching: the first step's
    // watch answers at once (the end is written), but only within the step, 10-100% of the
    // period: 5 s, not 500 ms, so that a loaded machine's watch is not cut short.
    c.dead_timeout = quiet ? 2s : 20s;
    c.quiet_start_nodes = quiet ? 3 : 4;
    auto [nodes, infos] = FormRoundOfThree(c);
    // The three form one round: ranks 0..2 once each, one world size.
    std::set<int> ranks;
    for (auto& info : infos) {
      ASSERT_TRUE(info && info->ok()) << info->status().ToString();
      EXPECT_EQ((*info)->group_world_size, 3);
      EXPECT_EQ((*info)->WorldSize(), 3);
      ranks.insert((*info)->group_rank);
    }
    EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
    // The node of slot 1 ends the round before anyone's first step.
    rendezvous::FailureRecord failure{0, "host0", 1, 0, "boom"};
    int ender = 0;
    while ((*infos[ender])->slot != 1) ++ender;
    ASSERT_TRUE(nodes[ender]
                    ->EndRound(0, {rendezvous::RoundEnd::Kind::kFailure, "rank 0"}, &failure)
                    .ok());
    for (int i = 0; i < 3; ++i) {
      if (i == ender) continue;
      auto first = nodes[i]->WatchStep(**infos[i]);
      ASSERT_TRUE(first.ok()) << first.status().ToString();
      EXPECT_EQ(first->has_value(), !quiet) << "the first step learns the end only watching";
      std::optional<rendezvous::RoundEnd> ended = *first;
      for (int step = 0; !ended && step < 20; ++step) {
        auto next = nodes[i]->WatchStep(**infos[i]);
        ASSERT_TRUE(next.ok()) << next.status().ToString();
        ended = *next;
        EXPECT_TRUE(ended.has_value()) << "the first beat reads the end";
      }
      ASSERT_TRUE(ended.has_value());
      EXPECT_EQ(ended->kind, rendezvous::RoundEnd::Kind::kFailure);
      EXPECT_EQ(ended->detail, "rank 0");
    }
  }
}

// A quiet round's nodes rest between their beats on a watch of the round's end that etcd
// holds for them (Store::Await), so they learn the end as it is written, not at their next
// beat (a beat period: 20 s at 10,000 nodes): after the end, no node beat again. Above
// quiet_watch_max_nodes they hold none and learn it with a beat.
TEST_F(EtcdStoreTest, AQuietRoundLearnsItsEndAsItIsWritten) {
  for (const bool held : {true, false}) {
    SCOPED_TRACE(held ? "held watch" : "no held watch");
    rendezvous::RendezvousConfig c;
    c.run_id = prefix_ + (held ? "-held" : "-beats");
    c.min_nodes = c.max_nodes = 3;
    c.join_timeout = 20s;
    c.heartbeat_interval = 100ms;
    c.dead_timeout = 40s;  // beats every 10 s; the first after 1-10 s
    c.quiet_start_nodes = 3;
    c.quiet_watch_max_nodes = held ? 3 : 2;
    auto [nodes, infos] = FormRoundOfThree(c);
    int ender = 0;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(infos[i] && infos[i]->ok()) << infos[i]->status().ToString();
      if ((*infos[i])->slot == 1) ender = i;
    }
    std::vector<std::optional<rendezvous::RoundEnd>> ended(3);
    std::vector<std::string> errors(3);
    std::vector<std::thread> watchers;
    const Deadline give_up = Deadline::After(60s);
    for (int i = 0; i < 3; ++i) {
      if (i == ender) continue;
      watchers.emplace_back([&, i] {
        while (!ended[i] && !give_up.expired()) {
          auto step = nodes[i]->WatchStep(**infos[i]);
          if (!step.ok()) {
            errors[i] = step.status().ToString();
            return;
          }
          ended[i] = *step;
        }
      });
    }
    // Once both have beaten (each holds its watch from its first beat on), the end.
    const std::string r0 = "rdzv/" + c.run_id + "/r0/";
    std::vector<std::string> beats;
    for (int i = 0; i < 3; ++i) {
      if (i != ender) beats.push_back(r0 + "hb" + std::to_string((*infos[i])->slot));
    }
    std::vector<std::optional<std::string>> before;
    while (!give_up.expired()) {
      auto now = store_->Peek(beats, Soon());
      ASSERT_TRUE(now.ok());
      before = *now;
      if (before[0] && before[1]) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls the store
    }
    rendezvous::FailureRecord failure{0, "host0", 1, 0, "boom"};
    ASSERT_TRUE(nodes[ender]
                    ->EndRound(0, {rendezvous::RoundEnd::Kind::kFailure, "rank 0"}, &failure)
                    .ok());
    for (auto& t : watchers) t.join();
    for (int i = 0; i < 3; ++i) {
      if (i == ender) continue;
      ASSERT_TRUE(ended[i].has_value()) << "node " << i << ": " << errors[i];
      EXPECT_EQ(ended[i]->kind, rendezvous::RoundEnd::Kind::kFailure);
    }
    auto after = store_->Peek(beats, Soon());
    ASSERT_TRUE(after.ok());
    for (size_t b = 0; b < beats.size(); ++b) {
      if (held) {
        EXPECT_EQ((*after)[b], before[b]) << "a node beat again before it learned the end";
      } else {
        EXPECT_NE((*after)[b], before[b]) << "a node learned the end without a beat";
      }
    }
  }
}

// Silent dates keys by etcd's own order of writes: a key written before the moment
// `quiet_for` ago is silent, one written since is not, an absent one is; a client that has
// no answer from that long ago dates only keys written after its first (kFailedPrecondition).
TEST_F(EtcdStoreTest, SilentDatesWritesByEtcdsRevisions) {
  ASSERT_TRUE(store_->Set("old", "1", Soon()).ok());
  auto fresh = Make();
  ASSERT_TRUE(fresh->Peek({"a"}, Soon()).ok() && store_->Set("new", "1", Soon()).ok());
  auto early = fresh->Silent({"new", "a"}, 10s, Soon());
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  EXPECT_EQ(*early, (std::vector<bool>{false, true}));
  EXPECT_EQ(fresh->Silent({"old"}, 10s, Soon()).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store_->Set("hb1", "1", Deadline::After(5s)).ok());
  // Answers at least 300 ms after that write (their revisions date it).
  const auto written = SteadyClock::now();
  while (SteadyClock::now() - written < 400ms) {
    ASSERT_TRUE(store_->Peek({"hb1"}, Deadline::After(5s)).ok());
  }
  ASSERT_TRUE(store_->Set("hb2", "1", Deadline::After(5s)).ok());
  auto silent = store_->Silent({"hb1", "hb2", "hb3"}, 200ms, Deadline::After(5s));
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  EXPECT_EQ(*silent, (std::vector<bool>{true, false, true}));
  // A write makes it live again.
  ASSERT_TRUE(store_->Set("hb1", "2", Deadline::After(5s)).ok());
  silent = store_->Silent({"hb1", "hb2", "hb3"}, 200ms, Deadline::After(5s));
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  EXPECT_EQ(*silent, (std::vector<bool>{false, false, true}));
  // A key on a lease is kept by its holder's renewals, not writes: never silent while it is
  // there (etcd deletes it when the lease ends).
  EtcdStoreOptions o;
  o.endpoints = SharedCluster()->Endpoints();
  o.prefix = prefix_;
  o.lease_ttl = 30s;
  auto leased = EtcdStore::Connect(o, Soon());
  ASSERT_TRUE(leased.ok()) << leased.status().ToString();
  ASSERT_TRUE((*leased)->Set("hb4", "alive", Soon()).ok());
  const auto put = SteadyClock::now();
  while (SteadyClock::now() - put < 400ms) ASSERT_TRUE(store_->Peek({"hb4"}, Soon()).ok());
  silent = store_->Silent({"hb3", "hb4"}, 200ms, Deadline::After(5s));
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  EXPECT_EQ(*silent, (std::vector<bool>{true, false}));
}

// How many watch streams etcd's members have started (their /metrics), to tell a watch
// held across calls from one per call.
int64_t WatchesStarted(const std::vector<std::string>& endpoints) {
  int64_t total = 0;
  for (const auto& endpoint : endpoints) {
    std::string text;
    CURL* h = curl_easy_init();
    const std::string url = "http://" + endpoint + "/metrics";
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &text);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, +[](char* d, size_t s, size_t n, void* out) {
      static_cast<std::string*>(out)->append(d, s * n);
      return s * n;
    });
    EXPECT_EQ(curl_easy_perform(h), CURLE_OK) << url;
    curl_easy_cleanup(h);
    for (const auto& line : Split(text, '\n')) {
      if (line.rfind("grpc_server_started_total{", 0) == 0 &&
          line.find("grpc_method=\"Watch\"") != std::string::npos) {
        total += ParseInt64(line.substr(line.rfind(' ') + 1)).value_or(0);
      }
    }
  }
  return total;
}

// Await holds one watch across calls: calls that end at their deadline leave it open and
// the next call for the key goes on with it (one watch stream started for three calls), a
// put made between calls is handed over by the next one, a put during a call ends it with
// the value, and Abort ends a call in progress.
TEST_F(EtcdStoreTest, AwaitHoldsOneWatchAcrossCalls) {
  auto reader = Make();
  auto read = reader->Beat("", {"end"}, {}, Soon());  // "end" absent at this revision
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_FALSE(read->peeked[0].has_value());
  ASSERT_GT(read->revision, 0);
  const auto endpoints = SharedCluster()->Endpoints();
  const int64_t watches_before = WatchesStarted(endpoints);
  for (int call = 0; call < 3; ++call) {
    auto none = reader->Await("end", read->revision, Deadline::AfterMs(200));
    ASSERT_TRUE(none.ok()) << none.status().ToString();
    EXPECT_FALSE(none->has_value());
  }
  EXPECT_EQ(WatchesStarted(endpoints) - watches_before, 1) << "one watch for the three calls";
  // A put between calls: the next call hands it over.
  ASSERT_TRUE(store_->Set("end", "between", Soon()).ok());
  auto between = reader->Await("end", read->revision, Soon());
  ASSERT_TRUE(between.ok()) << between.status().ToString();
  EXPECT_EQ(between->value_or("(none)"), "between");
  // A put during a call ends it with the value (well before its 60 s deadline).
  read = reader->Beat("", {"end2"}, {}, Soon());
  ASSERT_TRUE(read.ok());
  ASSERT_TRUE(reader->Await("end2", read->revision, Deadline::AfterMs(100)).ok());  // held
  std::thread writer([this] { ASSERT_TRUE(store_->Set("end2", "during", Soon()).ok()); });
  auto during = reader->Await("end2", read->revision, Deadline::AfterMs(60000));
  writer.join();
  ASSERT_TRUE(during.ok()) << during.status().ToString();
  EXPECT_EQ(during->value_or("(none)"), "during");
  // Abort ends a call in progress; a store that holds no wait says so.
  std::thread aborter([&] {
    while (WatchesStarted(endpoints) - watches_before < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // poll etcd's count
    }
    reader->Abort();
  });
  auto aborted = reader->Await("end3", read->revision, Deadline::AfterMs(60000));
  aborter.join();
  EXPECT_EQ(aborted.status().code(), StatusCode::kCancelled) << aborted.status().ToString();
  auto none = store_->Await("end", 0, Soon());
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
}

// A beat dates the keys it reads by etcd's revisions between this client's answers: a peer's
// counter written once and then left alone reads as about as old as it is, not "seen now".
TEST_F(EtcdStoreTest, ABeatDatesThePeersLastWrite) {
  auto watcher = Make();
  auto ms = [](Duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  const auto before = SteadyClock::now();  // the write comes after this
  ASSERT_TRUE(watcher->Beat("hb1", {"hb2"}, {}, Soon()).ok());
  ASSERT_TRUE(store_->Set("hb2", "1", Soon()).ok());
  ASSERT_TRUE(watcher->Beat("hb1", {"hb2"}, {}, Soon()).ok());
  const auto seen = SteadyClock::now();  // an answer that reached the write came by now
  // Other writes go on meanwhile (as other nodes' beats would), and the watcher beats.
  while (SteadyClock::now() - seen < std::chrono::milliseconds(800)) {
    ASSERT_TRUE(store_->Set("other", "x", Soon()).ok());
    ASSERT_TRUE(watcher->Beat("hb1", {"hb2"}, {}, Soon()).ok());
  }
  const auto asked = SteadyClock::now();
  auto step = watcher->Beat("hb1", {"hb2"}, {}, Soon());
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ASSERT_EQ(step->peeked[0].value_or(""), "1");
  // Dated between the answers around the write: after `before`, and no later than the
  // answer that reached it (its sample's 100 ms window): 650 ms old at least, not "now".
  EXPECT_GE(step->peeked_age_ms[0], ms(asked - seen) - 150) << "dated when seen, not written";
  EXPECT_LE(step->peeked_age_ms[0], ms(asked - before) + 50);
}

// A quiet round on etcd (counter beats, no watch between beats) that loses two nodes at
// once is carried without both: one end, one restart, the survivors' next round formed by
// one read each (no join), ranks in their old order. What 10,000 nodes do after a loss.
TEST_F(EtcdStoreTest, AQuietRoundThatLosesTwoNodesIsCarriedWithoutThem) {
  rendezvous::RendezvousConfig c;
  c.run_id = prefix_ + "-carry";
  c.min_nodes = 2;
  c.max_nodes = 5;
  c.join_timeout = 20s;
  c.last_call = 1s;
  c.heartbeat_interval = 100ms;
  c.dead_timeout = 2s;  // beats every 500 ms
  c.max_restarts = 3;
  c.quiet_start_nodes = c.carry_start_nodes = 5;
  auto s = rendezvous::testing::RunLossScenario([this] { return Make(); }, c, 5, {1, 4}, 30s);
  int survivors = 0;
  for (int i = 0; i < 5; ++i) {
    if (s.lost[i]) continue;
    ASSERT_TRUE(s.ended[i].has_value()) << "agent " << i << ": " << s.watch_error;
    EXPECT_EQ(s.ended[i]->kind, rendezvous::RoundEnd::Kind::kDeadNode);
    ASSERT_TRUE(s.next[i] && s.next[i]->ok()) << s.next[i]->status().ToString();
    const auto& info = **s.next[i];
    EXPECT_EQ(info.round, 1);
    EXPECT_EQ(info.group_world_size, 3);
    EXPECT_EQ(info.restart_count, 1);
    EXPECT_EQ(info.carried.left_out, (std::vector<int>{1, 4}));
    EXPECT_EQ(info.RecordSlot(info.slot), (*s.first[i])->slot);
    // Old slots 2, 3, 5 are ranks 0, 1, 2; the master is old slot 2's node.
    EXPECT_EQ(info.group_rank, (*s.first[i])->slot == 2 ? 0 : (*s.first[i])->slot == 3 ? 1 : 2);
    EXPECT_EQ(info.master.host, rendezvous::testing::ScenarioNode(s.AgentOfSlot(2)).host);
    ++survivors;
  }
  EXPECT_EQ(survivors, 3);
  auto joined = store_->Peek({"rdzv/" + c.run_id + "/r1/slot/ticket"}, Deadline::After(5s));
  ASSERT_TRUE(joined.ok());
  EXPECT_FALSE((*joined)[0].has_value()) << "a node joined the carried round";
}

// On etcd a node's liveness is a lease on its key r<R>/hb<S> (Store::LeaseKey): its first
// beat puts "alive" on the lease and the later ones only renew it (the key's revision stays
// that of the first beat: no raft write per beat), and a node that stops beating (hung: its
// process and connection live on) is found by its watcher once etcd deleted its key at the
// lease's end: the round ends as a dead node's, naming it, on every other node.
TEST_F(EtcdStoreTest, ASilentNodesLeaseEndsTheRound) {
  rendezvous::RendezvousConfig c;
  c.run_id = prefix_ + "-leased";
  c.min_nodes = c.max_nodes = 3;
  c.join_timeout = 20s;
  c.heartbeat_interval = 100ms;
  c.dead_timeout = 2s;  // the lease's TTL (etcd's shortest with its default raft timing)
  auto [nodes, infos] = FormRoundOfThree(c);
  std::vector<std::thread> threads;
  for (auto& info : infos) {
    ASSERT_TRUE(info && info->ok()) << info->status().ToString();
    ASSERT_EQ((*info)->group_world_size, 3);
  }
  // The node of slot 3 beats three times, then stops (hung); the others step until the
  // round ends.
  int victim = 0;
  while ((*infos[victim])->slot != 3) ++victim;
  const std::string victim_key = fmt::format("rdzv/{}/r0/hb3", c.run_id);
  std::vector<std::optional<rendezvous::RoundEnd>> ended(3);
  std::vector<Status> errors(3);
  std::optional<std::string> alive;
  int64_t first_revision = 0, later_revision = 0;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      const Deadline give_up = Deadline::After(60s);
      for (int step = 0; !give_up.expired(); ++step) {
        if (i == victim && step == 4) return;  // hung from here on
        auto r = nodes[i]->WatchStep(**infos[i]);
        if (!r.ok()) {
          errors[i] = r.status();
          return;
        }
        if (*r) {
          ended[i] = *r;
          return;
        }
        if (i == victim && step >= 1) {  // step 0 takes no beat; 1 puts the key, 2-3 renew
          int64_t revision = 0;
          auto value = store_->GetSince(victim_key, &revision, Deadline::After(5s));
          if (value.ok()) alive = *value;
          (step == 1 ? first_revision : later_revision) = revision;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(alive, "alive");
  EXPECT_GT(first_revision, 0);
  EXPECT_EQ(later_revision, first_revision) << "a renewal wrote the key again";
  for (int i = 0; i < 3; ++i) {
    if (i == victim) continue;
    ASSERT_TRUE(errors[i].ok()) << errors[i].ToString();
    ASSERT_TRUE(ended[i].has_value()) << "node " << i << ": the round did not end";
    EXPECT_EQ(ended[i]->kind, rendezvous::RoundEnd::Kind::kDeadNode);
    EXPECT_NE(ended[i]->detail.find("node 2 (host" + std::to_string(victim) + " at 10.0.0.1)"),
              std::string::npos)
        << ended[i]->detail;
  }
  // etcd deleted the key with the lease.
  auto gone = store_->Peek({victim_key}, Deadline::After(5s));
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  EXPECT_FALSE((*gone)[0].has_value());
}

// A key on the key lease (LeaseKey): the first beat puts "alive" on it only where the key is
// absent (a node that finished before its first beat keeps "finished"), and reads what it
// was asked to; a clean exit revokes the lease: "alive" goes with it, "finished" (written
// off the lease) stays.
TEST_F(EtcdStoreTest, AKeyLeasePutsOnlyWhereTheKeyIsAbsent) {
  std::shared_ptr<EtcdStore> a = Make(), b = Make();
  ASSERT_TRUE(a->LeaseKey("hb1", 3s, Soon()).ok());
  ASSERT_TRUE(b->LeaseKey("hb2", 3s, Soon()).ok());
  ASSERT_TRUE(store_->Set("hb2", "finished", Soon()).ok());
  auto first = a->Beat("hb1", {"hb2"}, {}, Soon());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->peeked, (std::vector<std::optional<std::string>>{"finished"}));
  auto other = b->Beat("hb2", {"hb1"}, {}, Soon());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(other->peeked, (std::vector<std::optional<std::string>>{"alive"}));
  auto renewed = a->Beat("hb1", {"hb2"}, {}, Soon());  // a renewal and a read
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  EXPECT_EQ(renewed->peeked, (std::vector<std::optional<std::string>>{"finished"}));
  auto both = store_->Peek({"hb1", "hb2"}, Soon());
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(*both, (std::vector<std::optional<std::string>>{"alive", "finished"}));
  a.reset();  // clean exits revoke their leases
  b.reset();
  auto after = store_->Peek({"hb1", "hb2"}, Soon());
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(*after, (std::vector<std::optional<std::string>>{std::nullopt, "finished"}));
}

TEST(EtcdAuthTest, UserPasswordAndTokenRenewal) {
  if (!fs::exists(kEtcd)) GTEST_SKIP() << kEtcd << " is not installed";
  EtcdCluster cluster;
  std::string error;
  ASSERT_TRUE(cluster.Start(1, {"--auth-token", "simple", "--auth-token-ttl", "1"}, &error))
      << error;
  ASSERT_NE(cluster.Post(0, "/v3/auth/role/add", {{"name", "root"}}), "");
  ASSERT_NE(cluster.Post(0, "/v3/auth/user/add", {{"name", "root"}, {"password", "pw"}}), "");
  ASSERT_NE(cluster.Post(0, "/v3/auth/user/grant", {{"user", "root"}, {"role", "root"}}), "");
  ASSERT_NE(cluster.Post(0, "/v3/auth/enable", json::object()), "");

  EtcdStoreOptions o;
  o.endpoints = cluster.Endpoints();
  o.prefix = "auth";
  auto anonymous = EtcdStore::Connect(o, Soon());
  ASSERT_FALSE(anonymous.ok());
  EXPECT_EQ(anonymous.status().code(), StatusCode::kPermissionDenied)
      << anonymous.status().ToString();
  o.user = "root";
  o.password = "wrong";
  auto wrong = EtcdStore::Connect(o, Soon());
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  EXPECT_EQ(wrong.status().message().find("wrong"), std::string::npos);
  o.password = "pw";
  auto s = EtcdStore::Connect(o, Soon());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)->Set("k", "v", Soon()).ok());
  // The simple token expires after its TTL of 1 s: the client authenticates again.
  std::this_thread::sleep_for(2500ms);
  EXPECT_EQ(*(*s)->Get("k", Soon()), "v");
  EXPECT_EQ(*(*s)->Add("n", 2, Soon()), 2);
}

// Makes a CA, a server certificate for 127.0.0.1 and a client certificate with openssl.
bool MakeCertificates(const fs::path& dir, std::string* error) {
  const std::string d = dir.string();
  const std::string script = fmt::format(
      "set -e; cd '{0}';"
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=cohort-test-ca "
      "-keyout ca.key -out ca.crt;"
      "printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > ext;"
      "for n in server client; do "
      "openssl req -newkey rsa:2048 -nodes -subj /CN=$n -keyout $n.key -out $n.csr;"
      "openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile ext -out $n.crt; done",
      d);
  int rc = std::system(("{ " + script + "; } > '" + d + "/openssl.log' 2>&1").c_str());
  if (rc != 0) *error = "openssl failed; see " + d + "/openssl.log";
  return rc == 0;
}

TEST(EtcdTlsTest, ClientCertificatesOverHttps) {
  if (::access(kEtcd, X_OK) != 0) GTEST_SKIP() << "etcd-server not installed";
  if (std::system("command -v openssl > /dev/null") != 0) GTEST_SKIP() << "no openssl";
  fs::path dir = fs::temp_directory_path() / ("cohort-etcd-tls-" + RandomHex(6));
  fs::create_directories(dir);
  std::string error;
  ASSERT_TRUE(MakeCertificates(dir, &error)) << error;
  TlsFiles client{(dir / "ca.crt").string(), (dir / "client.crt").string(),
                  (dir / "client.key").string()};
  EtcdCluster cluster;
  cluster.UseTls(client, (dir / "server.crt").string(), (dir / "server.key").string());
  ASSERT_TRUE(cluster.Start(1, {}, &error)) << error;

  EtcdStoreOptions o;
  o.endpoints = {"https://" + cluster.Endpoint(0)};
  o.prefix = "tls";
  o.request_timeout = 3s;
  o.ca_file = client.ca;
  o.cert_file = client.cert;
  o.key_file = client.key;
  auto store = EtcdStore::Connect(o, Deadline::After(10s));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->Set("k", "over tls", Deadline::After(5s)).ok());
  EXPECT_EQ(*(*store)->Get("k", Deadline::After(5s)), "over tls");

  // Without the client certificate the member refuses the connection.
  EtcdStoreOptions no_cert = o;
  no_cert.cert_file.clear();
  no_cert.key_file.clear();
  auto refused = EtcdStore::Connect(no_cert, Deadline::After(5s));
  bool failed = !refused.ok() || !(*refused)->Set("k2", "x", Deadline::After(3s)).ok();
  EXPECT_TRUE(failed);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// Kill the leader of three: a client with every endpoint keeps working (including a Get
// blocked on a watch served by the dead leader); then kill a second member: calls fail with
// kDeadlineExceeded/kUnavailable within their timeout instead of hanging.
TEST(EtcdClusterTest, FailoverThenQuorumLoss) {
  if (!fs::exists(kEtcd)) GTEST_SKIP() << kEtcd << " is not installed";
  EtcdCluster cluster;
  std::string error;
  auto t0 = SteadyClock::now();
  ASSERT_TRUE(cluster.Start(3, {}, &error)) << error;
  std::printf("3-member etcd healthy in %.2f s\n", SecondsSince(t0));
  int leader = -1;
  for (int i = 0; i < 50 && leader < 0; ++i) {
    leader = cluster.Leader();
    if (leader < 0) std::this_thread::sleep_for(100ms);
  }
  ASSERT_GE(leader, 0);
  // The leader first, so the clients talk to it until it dies.
  std::vector<std::string> endpoints = {cluster.Endpoint(leader)};
  for (size_t i = 0; i < cluster.size(); ++i) {
    if (static_cast<int>(i) != leader) endpoints.push_back(cluster.Endpoint(i));
  }
  auto client = Connect(endpoints, "failover", 3s);
  auto waiter = Connect(endpoints, "failover", 3s);
  ASSERT_TRUE(client && waiter);
  ASSERT_TRUE(client->Set("before", "1", Soon()).ok());

  std::string got;
  std::thread blocked([&] {
    auto r = waiter->Get("after", Deadline::AfterMs(20000));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) got = *r;
  });
  std::this_thread::sleep_for(200ms);
  cluster.Kill(leader);
  auto killed = SteadyClock::now();
  Status s = client->Set("after", "2", Deadline::AfterMs(10000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  double recover = SecondsSince(killed);
  std::printf("write after killing the leader took %.2f s\n", recover);
  EXPECT_LT(recover, 5.0);
  blocked.join();
  EXPECT_EQ(got, "2");
  EXPECT_EQ(*client->Get("before", Soon()), "1");
  EXPECT_EQ(*client->Add("n", 1, Soon()), 1);

  // Two of three down: no quorum. Every call returns within its timeout.
  for (size_t i = 0; i < cluster.size(); ++i) {
    if (static_cast<int>(i) != leader) {
      cluster.Kill(i);
      break;
    }
  }
  testing::internal::CaptureStderr();
  auto start = SteadyClock::now();
  Status put = client->Set("x", "1", Deadline::AfterMs(30000));
  double took = SecondsSince(start);
  EXPECT_TRUE(put.code() == StatusCode::kDeadlineExceeded || put.code() == StatusCode::kUnavailable)
      << put.ToString();
  EXPECT_LT(took, 4.0);
  start = SteadyClock::now();
  auto get = client->Get("never", Deadline::AfterMs(30000));
  EXPECT_FALSE(get.ok());
  EXPECT_TRUE(get.status().code() == StatusCode::kDeadlineExceeded ||
              get.status().code() == StatusCode::kUnavailable)
      << get.status().ToString();
  EXPECT_LT(SecondsSince(start), 4.0);
  // The outage is said in the log while it lasts, not only in the calls' errors.
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("has not answered for"), std::string::npos) << log;
  std::printf("calls without quorum failed after %.2f s: %s\n", took, put.ToString().c_str());
}

}  // namespace
}  // namespace cohort::store::etcd_test

namespace cohort::store::contract {
std::unique_ptr<StoreFactory> MakeFactory(const std::string& kind) {
  if (kind != "etcd" || !std::filesystem::exists(etcd_test::kEtcd) ||
      etcd_test::SharedCluster() == nullptr) {
    return nullptr;
  }
  return std::make_unique<etcd_test::EtcdFactory>();
}
}  // namespace cohort::store::contract
