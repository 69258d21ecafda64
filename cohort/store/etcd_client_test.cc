// EtcdStore's client without a real etcd: the parsing of endpoint lists, and retries
// against stand-in etcd gateways (cpp-httplib) that answer as an overloaded etcd does:
// "too many requests" is retried and "database space exceeded" is not, retries stay within
// the client's retry budget while etcd refuses, a ticket txn sent again after its first
// attempt timed out takes no second ticket, an Append outlasts the request timeout, and a
// leaderless cluster is asked again at a pace that follows the number of its clients. The
// tests against real etcd processes: etcd_store_test.cc.
#include "cohort/store/etcd_store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cohort/store/etcd_store_internal.h"

namespace cohort::store {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

Deadline Soon() { return Deadline::AfterMs(5000); }

TEST(EtcdEndpointsTest, Parse) {
  auto e = ParseEtcdEndpoints("h1:2379, h2 ,https://h3:1/,[::1]:5");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(*e, (std::vector<std::string>{"http://h1:2379", "http://h2:2379", "https://h3:1",
                                          "http://[::1]:5"}));
  EXPECT_EQ(ParseEtcdEndpoints("h1:2379", true)->at(0), "https://h1:2379");
  EXPECT_FALSE(ParseEtcdEndpoints("").ok());
  EXPECT_FALSE(ParseEtcdEndpoints("h1:notaport").ok());
}

// Serves a stand-in gateway's handlers (registered on http() first) on a loopback port from
// its own thread, from Serve() until destroyed. Declared as a gateway's last member, so that
// it stops before the state its handlers use is gone.
class LoopbackServer {
 public:
  httplib::Server& http() { return server_; }
  void Serve() {
    port_ = server_.bind_to_any_port("127.0.0.1");
    serving_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~LoopbackServer() {
    if (!serving_.joinable()) return;
    server_.stop();
    serving_.join();
  }
  std::string endpoint() const { return fmt::format("127.0.0.1:{}", port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread serving_;
};

// An error as etcd's gateway answers it: HTTP `status`, the gRPC code and the message.
void AnswerEtcdError(httplib::Response& res, int status, int code, const std::string& message) {
  res.status = status;
  res.set_content(json{{"error", message}, {"code", code}, {"message", message}}.dump(),
                  "application/json");
}

// A stand-in etcd gateway: ranges answer "no such key"; each put asks `refuse` whether to
// turn it down (the gRPC code and message etcd would send), else succeeds. Serves on a
// loopback port until destroyed.
class PutGateway {
 public:
  using Refusal = std::optional<std::pair<int, std::string>>;
  explicit PutGateway(std::function<Refusal()> refuse) : refuse_(std::move(refuse)) {
    server_.http().new_task_queue = [] { return new httplib::ThreadPool(48); };
    server_.http().Post("/v3/kv/range", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"header":{"revision":"1"},"count":"0"})", "application/json");
    });
    server_.http().Post("/v3/kv/put", [this](const httplib::Request&, httplib::Response& res) {
      ++puts_;
      if (Refusal r = refuse_()) {
        ++refused_;
        // etcd 3.4 sends "too many requests" with gRPC code 2 (unknown); code 8 is what its
        // error table names; "database space exceeded" is code 8.
        AnswerEtcdError(res, r->first == 8 ? 429 : 500, r->first, r->second);
        return;
      }
      res.set_content(R"({"header":{"revision":"2"}})", "application/json");
    });
    server_.Serve();
  }
  Result<std::unique_ptr<EtcdStore>> Connect(EtcdStoreOptions options = {}) {
    options.endpoints = {server_.endpoint()};
    return EtcdStore::Connect(options, Soon());
  }
  int puts() const { return puts_; }
  int refused() const { return refused_; }

 private:
  std::function<Refusal()> refuse_;
  std::atomic<int> puts_{0}, refused_{0};
  LoopbackServer server_;
};

// etcd refuses a write while more than 5,000 committed entries wait to be applied ("too
// many requests"; etcd 3.4's gateway answers it with gRPC code 2): at 5,000 and 10,000
// simulated nodes this ended joins. A stand-in gateway answers the first writes so; the
// client retries them, and does not retry the same code's "database space exceeded"
// (nothing to wait for).
TEST(EtcdOverloadTest, TooManyRequestsIsRetriedSpaceExceededIsNot) {
  std::atomic<int> refusals{2};
  std::atomic<bool> space_exceeded{false};
  PutGateway gateway([&]() -> PutGateway::Refusal {
    if (refusals.fetch_sub(1) <= 0) return std::nullopt;
    if (space_exceeded) return std::make_pair(8, "etcdserver: mvcc: database space exceeded");
    // Both codes of "too many requests" are retried.
    return std::make_pair(refusals == 1 ? 2 : 8, "etcdserver: too many requests");
  });
  auto store = gateway.Connect();
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Status overloaded = (*store)->Set("k", "v", Soon());
  EXPECT_TRUE(overloaded.ok()) << overloaded.ToString();
  EXPECT_EQ(gateway.puts(), 3) << "two refusals, then the write";
  space_exceeded = true;
  refusals = 1;
  Status full = (*store)->Set("k", "v", Soon());
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition) << full.ToString();
  EXPECT_NE(full.message().find("database space exceeded"), std::string::npos);
  EXPECT_EQ(gateway.puts(), 4) << "not retried";
}

// While etcd refuses every write ("too many requests") for two seconds, a client with forty
// writes to make sends them again within its retry budget (COHORT_ETCD_RETRY_BUDGET: 0.2 of
// its first tries, ten saved, 0.5 a second): without it each write was sent about four
// times in that time (pauses of 0.25, 0.5, 1 s...), 134 refused requests in one run, to an
// etcd already behind. Every write still succeeds once etcd takes them again (each answer
// lets one more held-back request go).
TEST(EtcdOverloadTest, RetriesWhileEtcdIsBehindStayWithinTheBudget) {
  const auto refuse_until = std::chrono::steady_clock::now() + 2s;
  PutGateway gateway([&]() -> PutGateway::Refusal {
    if (std::chrono::steady_clock::now() >= refuse_until) return std::nullopt;
    return std::make_pair(2, "etcdserver: too many requests");
  });
  EtcdStoreOptions options;
  options.request_timeout = 20s;  // the writes outlast the refusals
  auto store = gateway.Connect(options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  constexpr int kWrites = 40;
  std::vector<std::thread> writers;
  std::atomic<int> written{0};
  for (int i = 0; i < kWrites; ++i) {
    writers.emplace_back([&, i] {
      if ((*store)->Set(fmt::format("k{}", i), "v", Deadline::AfterMs(30000)).ok()) ++written;
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(written.load(), kWrites);
  // While refused: the first tries, the ten saved tokens, 0.2 per first try, 0.5 a second.
  EXPECT_LE(gateway.refused(), kWrites + 10 + 0.2 * kWrites + 0.5 * 2 + 1)
      << "refused " << gateway.refused();
  EXPECT_EQ(gateway.puts() - gateway.refused(), kWrites) << "each write accepted once";
}

// Thousands of nodes share one etcd: together they may not retry more at once than 100
// alone would, whatever their number (each saves a share); each still earns by time.
TEST(EtcdOverloadTest, ManyPeersShareWhatABudgetSavesAndEarns) {
  const RetryBudget::Options alone = RetryBudgetFor(0.2, 1), few = RetryBudgetFor(0.2, 100);
  EXPECT_DOUBLE_EQ(alone.per_second, 0.5);
  EXPECT_DOUBLE_EQ(alone.max_tokens, 10);
  EXPECT_DOUBLE_EQ(few.per_second, 0.5);
  const RetryBudget::Options many = RetryBudgetFor(0.2, 10000);
  EXPECT_DOUBLE_EQ(many.ratio, 0.2);
  EXPECT_DOUBLE_EQ(many.per_second, 0.5);
  EXPECT_DOUBLE_EQ(many.max_tokens, 1);  // every node may still retry once at once
}

// A stand-in etcd gateway for the ticket txn: applies it as etcd does (the marker's
// compare, the ticket key's version, a range at a past revision) and answers the first
// txn `late` after applying it, as a loaded member whose answer comes after the client's
// attempt gave up.
class LateTicketGateway {
 public:
  // What the first ticket txn gets: its answer `late` after it was applied; "too many
  // requests" (nothing applied); or "request timed out" although it was applied (a
  // proposal etcd took and applied after the server's own timeout).
  // kTimeOutUnapplied: "request timed out" and the txn lost (a leader change drops it).
  enum class First { kAnswerLate, kRefuse, kTimeOutButApply, kTimeOutUnapplied };
  explicit LateTicketGateway(std::chrono::milliseconds late, First first = First::kAnswerLate)
      : late_(late), first_(first) {
    server_.http().Post("/v3/kv/range", [this](const httplib::Request& req,
                                                httplib::Response& res) {
      json q = json::parse(req.body);
      std::lock_guard<std::mutex> lock(mu_);
      ++ranges_;
      json answer = {{"header", {{"revision", std::to_string(revision_)}}}, {"count", "0"}};
      if (auto it = markers_.find(q.value("key", std::string())); it != markers_.end()) {
        answer["kvs"] = json::array({{{"create_revision", std::to_string(it->second)}}});
      } else if (q.contains("revision")) {
        const int64_t at = std::stoll(q["revision"].get<std::string>());
        answer["kvs"] = json::array({{{"version", std::to_string(version_at_[at])}}});
      }
      res.set_content(answer.dump(), "application/json");
    });
    server_.http().Post("/v3/kv/txn", [this](const httplib::Request& req,
                                              httplib::Response& res) {
      json answer;
      bool late = false;
      const json q = json::parse(req.body);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!q.contains("compare")) {
          // The reads at a marker's revision: the ticket key's version then.
          json responses = json::array();
          for (const auto& op : q["success"]) {
            const int64_t at = std::stoll(op["request_range"]["revision"].get<std::string>());
            json kv = {{"version", std::to_string(version_at_[at])}};
            responses.push_back({{"response_range", {{"kvs", json::array({kv})}}}});
          }
          res.set_content(json{{"responses", responses}}.dump(), "application/json");
          return;
        }
        late = ++txns_ == 1;
        if (late && (first_ == First::kTimeOutButApply || first_ == First::kTimeOutUnapplied)) {
          if (first_ == First::kTimeOutButApply) Apply(q["compare"][0]["key"]);
          AnswerEtcdError(res, 503, 14, "etcdserver: request timed out");
          return;
        }
        if (late && first_ == First::kRefuse) {
          AnswerEtcdError(res, 500, 2, "etcdserver: too many requests");
          return;
        }
        answer = Apply(q["compare"][0]["key"]);
      }
      if (late) std::this_thread::sleep_for(late_);
      res.set_content(answer.dump(), "application/json");
    });
    server_.http().Post("/v3/kv/put", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      ++puts_;
      res.set_content(R"({"header":{}})", "application/json");
    });
    server_.Serve();
  }
  std::string endpoint() const { return server_.endpoint(); }
  int64_t txns() {
    std::lock_guard<std::mutex> lock(mu_);
    return txns_;
  }
  int64_t version() {
    std::lock_guard<std::mutex> lock(mu_);
    return version_;
  }
  int64_t puts() {
    std::lock_guard<std::mutex> lock(mu_);
    return puts_;
  }
  int64_t ranges() {
    std::lock_guard<std::mutex> lock(mu_);
    return ranges_;
  }

 private:
  json Apply(const std::string& marker) {
    if (auto it = markers_.find(marker); it != markers_.end()) {
      json kv = {{"create_revision", std::to_string(it->second)}};
      return {{"responses", json::array({{{"response_range", {{"kvs", json::array({kv})}}}}})}};
    }
    markers_[marker] = ++revision_;
    version_at_[revision_] = ++version_;
    json prev = {{"version", std::to_string(version_ - 1)}};
    return {{"succeeded", true},
            {"responses", json::array({{{"response_put", {{"prev_kv", prev}}}},
                                       {{"response_put", json::object()}}})}};
  }

  const std::chrono::milliseconds late_;
  const First first_;
  std::mutex mu_;
  int64_t version_ = 4, revision_ = 10, txns_ = 0, puts_ = 0, ranges_ = 0;  // four tickets taken before
  std::map<std::string, int64_t> markers_;          // marker -> create revision
  std::map<int64_t, int64_t> version_at_;           // revision -> the ticket key's version
  LoopbackServer server_;
};

// The client's attempt times out (a ticket txn's first attempt: the request timeout, 3 s) and
// it sends the same txn to the next member: no second ticket is taken.
TEST(EtcdOverloadTest, ARetriedTicketTxnTakesNoSecondTicket) {
  LateTicketGateway gateway(3500ms);  // longer than the request timeout: sent again
  EtcdStoreOptions options;
  options.endpoints = {gateway.endpoint(), gateway.endpoint()};  // two "members"
  options.request_timeout = 3s;
  auto store = EtcdStore::Connect(options, Soon());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto ticket = (*store)->TakeTicket("slot", Soon());
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  EXPECT_EQ(*ticket, 5) << "the ticket of the applied txn";
  EXPECT_EQ(gateway.txns(), 2) << "the txn was sent again";
  EXPECT_EQ(gateway.version(), 5) << "and took no second ticket";
  auto next = (*store)->TakeTicket("slot", Soon());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(*next, 6);
  store->reset();  // closes its kept-alive connections, which the server would wait out
}

// Told "too many requests", a join's ticket txn from one of 2,000 peers is sent again after
// about 2,000 / kPacedRequestsPerSecond = 2 s (jittered: at least half of it), not at once:
// the peers of a join's burst come back together at the rate etcd applies.
TEST(EtcdOverloadTest, ARefusedTicketOfOneOfManyPeersWaitsItsShare) {
  LateTicketGateway gateway(0ms, LateTicketGateway::First::kRefuse);
  EtcdStoreOptions options;
  options.endpoints = {gateway.endpoint()};
  options.request_timeout = 20s;
  options.peers = 2000;
  auto store = EtcdStore::Connect(options, Soon());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  auto ticket = (*store)->TakeTicket("slot", Soon());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  EXPECT_EQ(*ticket, 5);
  EXPECT_EQ(gateway.txns(), 2) << "refused once, then applied";
  EXPECT_GE(waited, 0.5 * 2000 / kPacedRequestsPerSecond) << "sent again after " << waited;
  store->reset();
}

// etcd took the first ticket txn but answered "request timed out" (its apply queue was over
// the server's timeout): the client looks for its marker instead of proposing the txn again.
// Applied later (at 10,000 nodes half the joins' first txns timed out so, and each copy sent
// again was applied too): the ticket that txn took, with no second proposal. Lost (a leader
// change drops it): the marker is not there, and the txn is sent again.
struct TimedOutTicketCase {
  LateTicketGateway::First first;
  int64_t txns;
};
class TimedOutTicketTest : public ::testing::TestWithParam<TimedOutTicketCase> {};

TEST_P(TimedOutTicketTest, IsLookedForBeforeItIsSentAgain) {
  LateTicketGateway gateway(0ms, GetParam().first);
  EtcdStoreOptions options;
  options.endpoints = {gateway.endpoint()};
  options.request_timeout = 20s;
  auto store = EtcdStore::Connect(options, Soon());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const int64_t ranges_before = gateway.ranges();  // (connecting reads too)
  auto ticket = (*store)->TakeTicket("slot", Soon());
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  EXPECT_EQ(*ticket, 5);
  EXPECT_EQ(gateway.txns(), GetParam().txns);
  EXPECT_EQ(gateway.ranges() - ranges_before, 1) << "one read of the marker";
  EXPECT_EQ(gateway.version(), 5) << "one ticket taken";
  auto next = (*store)->TakeTicket("slot", Soon());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(*next, 6);
  store->reset();
}

INSTANTIATE_TEST_SUITE_P(
    EtcdOverloadTest, TimedOutTicketTest,
    ::testing::Values(TimedOutTicketCase{LateTicketGateway::First::kTimeOutButApply, 1},
                      TimedOutTicketCase{LateTicketGateway::First::kTimeOutUnapplied, 2}),
    [](const auto& info) {
      return info.param.first == LateTicketGateway::First::kTimeOutButApply ? "AppliedLater"
                                                                            : "Lost";
    });

// The whole request timeout (1 s) passes without an answer: a join's Append sends the same
// ticket txn (which holds its record) again until the caller's deadline, instead of failing
// (at 10,000 simulated nodes an overloaded etcd failed joins so).
TEST(EtcdOverloadTest, AnAppendOutlastsTheRequestTimeout) {
  LateTicketGateway gateway(1500ms);
  EtcdStoreOptions options;
  options.endpoints = {gateway.endpoint()};
  options.request_timeout = 1s;
  auto store = EtcdStore::Connect(options, Soon());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto ticket = (*store)->Append("slot", "node", "me", Soon());
  ASSERT_TRUE(ticket.ok()) << ticket.status().ToString();
  EXPECT_EQ(*ticket, 5);
  EXPECT_EQ(gateway.txns(), 2);
  EXPECT_EQ(gateway.version(), 5);
  EXPECT_EQ(gateway.puts(), 0) << "the record goes in the ticket txn";
  store->reset();
}

// A stand-in member that answers every range "etcdserver: no leader" (HTTP 503, gRPC code
// 14, as etcd's gateway does between a leader's loss and the next election) once told to.
class LeaderlessGateway {
 public:
  LeaderlessGateway() {
    server_.http().Post("/v3/kv/range", [this](const httplib::Request&, httplib::Response& res) {
      if (!leaderless_) {
        res.set_content(R"({"header":{"revision":"1"},"count":"0"})", "application/json");
        return;
      }
      ++refused_;
      AnswerEtcdError(res, 503, 14, "etcdserver: no leader");
    });
    server_.Serve();
  }
  std::string endpoint() const { return server_.endpoint(); }
  void LoseLeader() { leaderless_ = true; }
  int refused() const { return refused_; }

 private:
  std::atomic<bool> leaderless_{false};
  std::atomic<int> refused_{0};
  LoopbackServer server_;
};

// A cluster that stays silent (no leader) is asked again by each of its clients after
// pauses that double from 20 ms to a ceiling that grows with how many they are (members x
// peers / kPacedRequestsPerSecond; jittered 50-100%): one of 10,000 clients asks at most
// ten times in eight seconds (its pauses reach 5 s), where one alone goes on every 250-500
// ms. At 10,000 nodes that 500 ms ceiling was tens of thousands of attempts a second in all
// while three members on two cores elected no leader for minutes. Either way the call
// fails with the cluster's reason once its time is up.
TEST(EtcdOverloadTest, ALeaderlessClusterIsAskedAgainAtTheFleetsPace) {
  std::map<int64_t, int> asked;
  for (int64_t peers : {int64_t{1}, int64_t{10000}}) {
    LeaderlessGateway gateway;
    EtcdStoreOptions options;
    options.endpoints = {gateway.endpoint()};
    options.request_timeout = 8s;
    options.peers = peers;
    auto store = EtcdStore::Connect(options, Soon());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    gateway.LoseLeader();
    auto value = (*store)->Get("k", Deadline::After(8s));
    ASSERT_FALSE(value.ok());
    EXPECT_TRUE(value.status().code() == StatusCode::kDeadlineExceeded ||
                value.status().code() == StatusCode::kUnavailable)
        << value.status().ToString();
    EXPECT_NE(value.status().message().find("no leader"), std::string::npos)
        << value.status().ToString();
    asked[peers] = gateway.refused();
    store->reset();
  }
  EXPECT_GE(asked[10000], 1);
  EXPECT_LE(asked[10000], 10) << "one client alone asked " << asked[1] << " times";
}

// A stand-in gateway that holds keys (full names) and answers ranges over them, counting
// the ranges and txns it was sent.
class KeysGateway {
 public:
  explicit KeysGateway(std::map<std::string, std::string> kvs) : kvs_(std::move(kvs)) {
    server_.http().Post("/v3/kv/range", [this](const httplib::Request& req,
                                                httplib::Response& res) {
      const json q = json::parse(req.body);
      const std::string from = *etcd::UnB64(q.value("key", std::string()));
      const std::string to = *etcd::UnB64(q.value("range_end", std::string()));
      std::lock_guard<std::mutex> lock(mu_);
      ++ranges_;
      spans_.emplace_back(from, to);
      json kvs = json::array();
      for (auto it = kvs_.lower_bound(from); it != kvs_.end() && it->first < to; ++it) {
        kvs.push_back(
            {{"key", etcd::B64(it->first)}, {"mod_revision", "3"}, {"create_revision", "3"}});
      }
      const size_t limit = std::stoul(q.value("limit", std::string("0")));
      const bool more = limit > 0 && kvs.size() > limit;
      if (more) kvs.erase(kvs.begin() + static_cast<std::ptrdiff_t>(limit), kvs.end());
      res.set_content(json{{"header", {{"revision", "9"}}}, {"kvs", kvs}, {"more", more}}.dump(),
                      "application/json");
    });
    server_.http().Post("/v3/kv/txn", [this](const httplib::Request&, httplib::Response& res) {
      ++txns_;
      AnswerEtcdError(res, 500, 2, "not served here");
    });
    server_.Serve();
  }
  Result<std::unique_ptr<EtcdStore>> Connect() {
    EtcdStoreOptions options;
    options.endpoints = {server_.endpoint()};
    options.prefix = "job";
    return EtcdStore::Connect(options, Soon());
  }
  int ranges() const { return ranges_; }
  int txns() const { return txns_; }
  std::vector<std::pair<std::string, std::string>> spans() {
    std::lock_guard<std::mutex> lock(mu_);
    return spans_;
  }

 private:
  std::map<std::string, std::string> kvs_;
  std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> spans_;
  std::atomic<int> ranges_{0}, txns_{0};
  LoopbackServer server_;
};

// A round's beat keys and its layout are read with one range from the smallest to the
// largest: their common prefix (r0/) holds the round's join markers too, more than twice
// as many keys, and a range over it fell back to a txn per 128 keys (79 at 10,000 nodes).
TEST(EtcdReadTest, ManyKeysAreReadWithOneRangeOverTheirSpan) {
  const std::string root = "/cohort/job/";
  std::map<std::string, std::string> held;
  std::vector<std::string> keys;
  for (int slot = 1; slot <= 300; ++slot) {
    held[root + fmt::format("r0/slot/t/{:04}", slot)] = "record";  // join markers
    keys.push_back(fmt::format("r0/hb{}", slot));
    if (slot != 7) held[root + keys.back()] = "1";  // node 7 never beat
  }
  held[root + "r0/layout"] = "layout";
  held[root + "r0/closed"] = "300";
  held[root + "r0/slot/ticket"] = "";
  held[root + "r0/ended_by"] = "dead:...";  // the end that reads them has claimed it
  keys.push_back("r0/layout");
  KeysGateway gateway(held);
  auto store = gateway.Connect();
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const int ranges_before = gateway.ranges(), txns_before = gateway.txns();
  auto present = (*store)->Check({keys}, Soon());
  ASSERT_TRUE(present.ok()) << present.status().ToString();
  EXPECT_FALSE(*present);  // hb7 is absent
  EXPECT_EQ(gateway.ranges() - ranges_before, 1);
  EXPECT_EQ(gateway.txns() - txns_before, 0);
  const auto span = gateway.spans().back();
  EXPECT_EQ(span.first, root + "r0/hb1");
  EXPECT_EQ(span.second, root + std::string("r0/layout") + std::string(1, '\0'));
}

}  // namespace
}  // namespace cohort::store
