// EtcdStore tests against real etcd processes (Debian etcd-server, /usr/bin/etcd), started
// here with their data in a temp dir on free loopback ports and stopped by SIGKILL. Covers
// the Store contract (the cases of StoreContract in store_test.cc), leases, auth with token
// renewal, failover across a 3-member cluster, a cluster without quorum, and a rendezvous of
// 8 agents. Skipped when etcd is not installed.
#include "cohort/store/etcd_store.h"
#include "cohort/store/store_contract.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <httplib.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "cohort/agent/job_directory.h"
#include "cohort/base/strings.h"
#include "cohort/rendezvous/rendezvous.h"

namespace cohort::store {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kEtcd = "/usr/bin/etcd";

Deadline Soon() { return Deadline::AfterMs(5000); }

// A free loopback port: bind port 0, read it, close (etcd cannot bind port 0 itself).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// A plain HTTP request for the harness (health, status, auth setup); "" on failure.
// TLS material for https members (CA, and a client certificate the members trust).
struct TlsFiles {
  std::string ca, cert, key;
};

std::string Http(const std::string& url, const std::string* post_body = nullptr,
                 long timeout_ms = 1000, const TlsFiles* tls = nullptr) {
  CURL* h = curl_easy_init();
  std::string out;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  if (tls) {
    curl_easy_setopt(h, CURLOPT_CAINFO, tls->ca.c_str());
    curl_easy_setopt(h, CURLOPT_SSLCERT, tls->cert.c_str());
    curl_easy_setopt(h, CURLOPT_SSLKEY, tls->key.c_str());
  }
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &out);
  if (post_body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, post_body->c_str());
  long code = 0;
  CURLcode rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(h);
  return rc == CURLE_OK && code == 200 ? out : std::string();
}

// N etcd members on loopback; killed (SIGKILL) and reaped on destruction.
class EtcdCluster {
 public:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) Kill(i);
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Members serve clients over https with these files and require client certificates.
  void UseTls(TlsFiles files, std::string server_cert, std::string server_key) {
    tls_ = std::move(files);
    server_cert_ = std::move(server_cert);
    server_key_ = std::move(server_key);
  }

  // Starts `n` members and waits until every one reports healthy.
  bool Start(int n, const std::vector<std::string>& extra_flags, std::string* error) {
    dir_ = fs::temp_directory_path() / ("cohort-etcd-test-" + RandomHex(6));
    fs::create_directories(dir_);
    std::string initial;
    for (int i = 0; i < n; ++i) {
      Member m{"s" + std::to_string(i), FreePort(), FreePort()};
      initial += fmt::format("{}{}=http://127.0.0.1:{}", i ? "," : "", m.name, m.peer_port);
      members_.push_back(m);
    }
    const std::string token = "cohort-test-" + RandomHex(4);
    for (auto& m : members_) {
      std::string client =
          fmt::format("{}://127.0.0.1:{}", tls_ ? "https" : "http", m.client_port);
      std::string peer = fmt::format("http://127.0.0.1:{}", m.peer_port);
      std::vector<std::string> args = {kEtcd,
                                       "--name",
                                       m.name,
                                       "--data-dir",
                                       (dir_ / m.name).string(),
                                       "--listen-client-urls",
                                       client,
                                       "--advertise-client-urls",
                                       client,
                                       "--listen-peer-urls",
                                       peer,
                                       "--initial-advertise-peer-urls",
                                       peer,
                                       "--initial-cluster",
                                       initial,
                                       "--initial-cluster-token",
                                       token,
                                       "--initial-cluster-state",
                                       "new",
                                       "--heartbeat-interval",
                                       "50",
                                       "--election-timeout",
                                       "500",
                                       "--logger",
                                       "zap",
                                       "--log-level",
                                       "error"};
      args.insert(args.end(), extra_flags.begin(), extra_flags.end());
      if (tls_) {
        for (const std::string& a : {std::string("--cert-file"), server_cert_,
                                     std::string("--key-file"), server_key_,
                                     std::string("--trusted-ca-file"), tls_->ca,
                                     std::string("--client-cert-auth")}) {
          args.push_back(a);
        }
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      std::string log = (dir_ / (m.name + ".log")).string();
      int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (log_fd >= 0) {
          ::dup2(log_fd, 1);
          ::dup2(log_fd, 2);
        }
        ::execv(kEtcd, argv.data());
        ::_exit(127);
      }
      if (log_fd >= 0) ::close(log_fd);
      if (pid < 0) {
        *error = "fork failed";
        return false;
      }
      m.pid = pid;
    }
    // Wait for /health of every member (a harness wait for an external process).
    auto give_up = SteadyClock::now() + 20s;
    for (auto& m : members_) {
      std::string url =
          fmt::format("{}://127.0.0.1:{}/health", tls_ ? "https" : "http", m.client_port);
      while (Http(url, nullptr, 1000, tls_ ? &*tls_ : nullptr).find("\"true\"") ==
             std::string::npos) {
        if (SteadyClock::now() > give_up) {
          *error =
              fmt::format("etcd member {} not healthy in 20 s (logs in {})", m.name, dir_.string());
          return false;
        }
        std::this_thread::sleep_for(50ms);
      }
    }
    return true;
  }

  std::string Endpoint(size_t i) const {
    return fmt::format("127.0.0.1:{}", members_[i].client_port);
  }
  std::vector<std::string> Endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(Endpoint(i));
    return out;
  }
  size_t size() const { return members_.size(); }

  void Kill(size_t i) {
    if (members_[i].pid <= 0) return;
    ::kill(members_[i].pid, SIGKILL);
    ::waitpid(members_[i].pid, nullptr, 0);
    members_[i].pid = -1;
  }

  // The index of the current leader, or -1.
  int Leader() const {
    std::string empty = "{}";
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i].pid <= 0) continue;
      std::string r =
          Http(fmt::format("http://127.0.0.1:{}/v3/maintenance/status", members_[i].client_port),
               &empty);
      json j = json::parse(r, nullptr, false);
      if (j.is_discarded() || !j.contains("leader")) continue;
      if (j["header"].value("member_id", "") == j["leader"].get<std::string>()) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

  std::string Post(size_t i, const std::string& path, const json& body) const {
    std::string text = body.dump();
    return Http(fmt::format("http://127.0.0.1:{}{}", members_[i].client_port, path), &text);
  }

 private:
  fs::path dir_;
  std::vector<Member> members_;
  std::optional<TlsFiles> tls_;
  std::string server_cert_, server_key_;
};

std::shared_ptr<EtcdStore> Connect(const std::vector<std::string>& endpoints,
                                   const std::string& prefix, Duration request_timeout = 5s) {
  EtcdStoreOptions o;
  o.endpoints = endpoints;
  o.prefix = prefix;
  o.request_timeout = request_timeout;
  auto s = EtcdStore::Connect(o, Soon());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return nullptr;
  return std::shared_ptr<EtcdStore>(std::move(s).value());
}

// etcd refuses a write while more than 5,000 committed entries wait to be applied ("too
// many requests"; etcd 3.4's gateway answers it with gRPC code 2): at 5,000 and 10,000
// simulated nodes this ended joins. A stand-in gateway answers the first writes so; the
// client retries them, and does not retry the same code's "database space exceeded"
// (nothing to wait for).
TEST(EtcdOverloadTest, TooManyRequestsIsRetriedSpaceExceededIsNot) {
  httplib::Server server;
  std::atomic<int> puts{0}, refusals{2};
  std::atomic<bool> space_exceeded{false};
  server.Post("/v3/kv/range", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"header":{"revision":"1"},"count":"0"})", "application/json");
  });
  server.Post("/v3/kv/put", [&](const httplib::Request&, httplib::Response& res) {
    ++puts;
    if (refusals.fetch_sub(1) > 0) {
      const std::string message = space_exceeded ? "etcdserver: mvcc: database space exceeded"
                                                 : "etcdserver: too many requests";
      // etcd 3.4 sends "too many requests" with gRPC code 2 (unknown); code 8 is what its
      // error table names (both are retried); "database space exceeded" is code 8.
      const int code = space_exceeded || puts == 2 ? 8 : 2;
      res.status = code == 8 ? 429 : 500;
      res.set_content(json{{"error", message}, {"code", code}, {"message", message}}.dump(),
                      "application/json");
      return;
    }
    res.set_content(R"({"header":{"revision":"2"}})", "application/json");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  EtcdStoreOptions options;
  options.endpoints = {fmt::format("127.0.0.1:{}", port)};
  auto store = EtcdStore::Connect(options, Soon());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Status overloaded = (*store)->Set("k", "v", Soon());
  EXPECT_TRUE(overloaded.ok()) << overloaded.ToString();
  EXPECT_EQ(puts.load(), 3) << "two refusals, then the write";
  space_exceeded = true;
  refusals = 1;
  Status full = (*store)->Set("k", "v", Soon());
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition) << full.ToString();
  EXPECT_NE(full.message().find("database space exceeded"), std::string::npos);
  EXPECT_EQ(puts.load(), 4) << "not retried";
  server.stop();
  serving.join();
}

// A stand-in etcd gateway for the ticket txn: applies it as etcd does (the marker's
// compare, the ticket key's version, a range at a past revision) and answers the first
// txn `late` after applying it, as a loaded member whose answer comes after the client's
// attempt gave up.
class LateTicketGateway {
 public:
  explicit LateTicketGateway(std::chrono::milliseconds late) : late_(late) {
    server_.Post("/v3/kv/range", [this](const httplib::Request& req, httplib::Response& res) {
      json q = json::parse(req.body);
      std::lock_guard<std::mutex> lock(mu_);
      json answer = {{"header", {{"revision", std::to_string(revision_)}}}, {"count", "0"}};
      if (q.contains("revision")) {
        const int64_t at = std::stoll(q["revision"].get<std::string>());
        answer["kvs"] = json::array({{{"version", std::to_string(version_at_[at])}}});
      }
      res.set_content(answer.dump(), "application/json");
    });
    server_.Post("/v3/kv/txn", [this](const httplib::Request& req, httplib::Response& res) {
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
        answer = Apply(q["compare"][0]["key"]);
      }
      if (late) std::this_thread::sleep_for(late_);
      res.set_content(answer.dump(), "application/json");
    });
    server_.Post("/v3/kv/put", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      ++puts_;
      res.set_content(R"({"header":{}})", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    serving_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~LateTicketGateway() {
    server_.stop();
    serving_.join();
  }
  std::string endpoint() const { return fmt::format("127.0.0.1:{}", port_); }
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
  httplib::Server server_;
  int port_ = 0;
  std::thread serving_;
  std::mutex mu_;
  int64_t version_ = 4, revision_ = 10, txns_ = 0, puts_ = 0;  // four tickets taken before
  std::map<std::string, int64_t> markers_;          // marker -> create revision
  std::map<int64_t, int64_t> version_at_;           // revision -> the ticket key's version
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

TEST(EtcdEndpointsTest, Parse) {
  auto e = ParseEtcdEndpoints("h1:2379, h2 ,https://h3:1/,[::1]:5");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(*e, (std::vector<std::string>{"http://h1:2379", "http://h2:2379", "https://h3:1",
                                          "http://[::1]:5"}));
  EXPECT_EQ(ParseEtcdEndpoints("h1:2379", true)->at(0), "https://h1:2379");
  EXPECT_FALSE(ParseEtcdEndpoints("").ok());
  EXPECT_FALSE(ParseEtcdEndpoints("h1:notaport").ok());
}

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
    std::vector<std::unique_ptr<rendezvous::Rendezvous>> nodes;
    std::vector<std::optional<Result<rendezvous::RendezvousInfo>>> infos(3);
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
      rendezvous::NodeInfo self{"host" + std::to_string(i), "10.0.0.1", 1, ""};
      nodes.push_back(std::make_unique<rendezvous::Rendezvous>(Make(), c, self));
    }
    for (int i = 0; i < 3; ++i) threads.emplace_back([&, i] { infos[i] = nodes[i]->Next(); });
    for (auto& t : threads) t.join();
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

// Kill the leader of three: a client with every endpoint keeps working (including a Get
// blocked on a watch served by the dead leader); then kill a second member: calls fail with
// kDeadlineExceeded/kUnavailable within their timeout instead of hanging.
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

namespace contract {
std::unique_ptr<StoreFactory> MakeFactory(const std::string& kind) {
  if (kind != "etcd" || !fs::exists(kEtcd) || SharedCluster() == nullptr) return nullptr;
  return std::make_unique<EtcdFactory>();
}
}  // namespace contract
}  // namespace cohort::store
