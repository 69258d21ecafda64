// The job-wide view end to end below the command line: agents' records in a real store
// (MemoryStore), real MetricsServers answering /api/state on loopback, and JobView merging
// them: a running node with its ranks, a node that ended cleanly, a killed node shown as
// LOST with the cause its survivors recorded, and an endpoint answered by another agent.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "cohort/agent/job_directory.h"
#include "cohort/base/temp_dir.h"
#include "cohort/metrics/http_server.h"
#include "cohort/metrics/job_view.h"
#include "cohort/net/socket.h"
#include "cohort/store/memory_store.h"

namespace cohort::agent {
namespace {

using json = nlohmann::json;

// An agent's endpoint: `agent` as its state, the ranks' exported snapshots in `metrics_dir`,
// rank 1's process is this test's.
std::unique_ptr<metrics::MetricsServer> Agent(json agent, metrics::EventLog* events,
                                              std::string metrics_dir = "") {
  metrics::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.events = events;
  o.metrics_dir = metrics_dir;
  o.state = [agent] { return agent; };
  o.workers = [] { return std::vector<metrics::WorkerProcess>{{1, 1, ::getpid()}}; };
  auto s = metrics::MetricsServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(*s);
}

std::string Url(int port) { return fmt::format("http://127.0.0.1:{}/", port); }

// A port nobody listens on (bound, then closed).
int DeadPort() {
  auto l = net::Listen({.host = "127.0.0.1", .port = 0});
  EXPECT_TRUE(l.ok());
  return *l->LocalPort();
}

TEST(JobDirectoryTest, PublishReadAndEnd) {
  store::MemoryStore store;
  const Deadline d = Deadline::AfterMs(5000);
  EXPECT_FALSE(PublishEndpoint(store, "job", json{{"host", "a"}}, d).ok());  // no url
  auto first = PublishEndpoint(store, "job", {{"url", "http://a:1/"}, {"addr", "10.0.0.1"}}, d);
  auto second = PublishEndpoint(store, "job", {{"url", "http://b:1/"}, {"addr", "10.0.0.2"}}, d);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, 1);
  EXPECT_EQ(*second, 2);
  ASSERT_TRUE(PublishEnd(store, "job", 2, {{"state", "SUCCEEDED"}, {"exit_code", 0}}, d).ok());
  ASSERT_TRUE(store.Set("metrics/job/node3", "not json", d).ok());  // skipped, not fatal
  ASSERT_TRUE(store.Add("metrics/job/node", 1, d).ok());
  auto entries = ReadDirectory(store, "job", d);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].record["addr"], "10.0.0.1");
  EXPECT_FALSE((*entries)[0].end.has_value());
  EXPECT_EQ((*entries)[1].end->at("state"), "SUCCEEDED");
  // Another job's directory is its own.
  EXPECT_TRUE(ReadDirectory(store, "other", d)->empty());
}

TEST(JobViewTest, RunningFinishedLostAndImpostor) {
  store::MemoryStore store;
  const Deadline d = Deadline::AfterMs(5000);
  // Node 1 runs two ranks and recorded that the job went on without 10.9.0.3.
  metrics::EventLog events(100);
  events.Add({{"type", "round"}, {"round", 0}, {"cause", "start"}});
  events.Add({{"type", "log"}, {"rank", 1}, {"line", "epoch 1 done"}});
  json agent1 = json::parse(R"({
    "run_id": "job", "host": "h", "state": "HEALTHY", "round": 1, "world_size": 2,
    "group_rank": 0, "restarts": 1,
    "ranks": [{"rank": 0, "state": "HEALTHY"}, {"rank": 1, "state": "HEALTHY"}]})");
  agent1["pid"] = ::getpid();
  TempDir dir("job-view-test-");
  auto gauge = [](const char* name, double v, json labels = json::object()) {
    return json{{"name", name}, {"type", "gauge"}, {"help", ""}, {"labels", labels},
                {"value", v}};
  };
  std::ofstream(dir.path() + "/rank0.json")
      << json{{"rank", 0}, {"time", 1.0},
               {"metrics", {gauge("cohort_train_step", 40),
                            gauge("cohort_train_samples_per_second", 100),
                            gauge("cohort_comm_bytes_total", 2e6, {{"op", "allreduce"}}),
                            gauge("cohort_comm_wait_fraction", 0.25)}}};
  std::ofstream(dir.path() + "/rank1.json")
      << json{{"rank", 1}, {"time", 1.0},
               {"metrics", {gauge("cohort_train_step", 40),
                            gauge("cohort_train_samples_per_second", 50)}}};
  auto a1 = Agent(agent1, &events, dir.path());
  // Node 4: its URL is answered by an agent that is not the one that published it.
  json other = {{"host", "h"}, {"pid", ::getpid() + 1}, {"state", "HEALTHY"}};
  auto impostor = Agent(other, nullptr);
  const int dead = DeadPort();
  for (auto [url, addr, pid] : {std::tuple{Url(a1->port()), "10.9.0.1", int(::getpid())},
                                std::tuple{Url(DeadPort()), "10.9.0.2", 7},
                                std::tuple{Url(dead), "10.9.0.3", 8},
                                std::tuple{Url(impostor->port()), "10.9.0.4", int(::getpid())}}) {
    ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", url}, {"addr", addr}, {"host", "h"},
                                               {"pid", pid}}, d).ok());
  }
  ASSERT_TRUE(PublishEnd(store, "job", 2, {{"state", "SUCCEEDED"}, {"exit_code", 0}}, d).ok());
  events.Add({{"type", "restart"}, {"round", 1},
              {"cause", "node 2 (h at 10.9.0.3) stopped sending heartbeats"}});

  metrics::JobView view({.list = [&store] { return ReadDirectory(store, "job", Deadline::AfterMs(2000)); },
                         .reuse = Duration::zero()});
  json job = view.Snapshot();
  ASSERT_EQ(job["nodes"].size(), 4u) << job.dump(1);
  const json& n1 = job["nodes"][0];
  EXPECT_EQ(n1["state"], "HEALTHY");
  ASSERT_EQ(n1["ranks"].size(), 2u);
  EXPECT_EQ(n1["ranks"][0]["step"], 40);
  EXPECT_EQ(n1["ranks"][0]["comm_bytes"], 2e6);
  EXPECT_EQ(n1["ranks"][0]["comm_wait"], 0.25);
  // Rank 1's process (this one) is sampled from /proc; rank 0 has none.
  EXPECT_GT(n1["ranks"][1]["rss_bytes"].get<double>(), 1e6) << n1["ranks"][1];
  EXPECT_TRUE(n1["ranks"][0]["rss_bytes"].is_null());
  EXPECT_EQ(job["nodes"][1]["state"], "SUCCEEDED");
  // Never answered: UNREACHABLE (not LOST: nothing says it ever worked), with the reason.
  const json& never = job["nodes"][2];
  EXPECT_EQ(never["state"], "UNREACHABLE");
  EXPECT_NE(never["cause"].get<std::string>().find("no answer"), std::string::npos)
      << never["cause"];
  const json& n4 = job["nodes"][3];
  EXPECT_EQ(n4["state"], "UNREACHABLE");
  EXPECT_NE(n4["cause"].get<std::string>().find("another agent"), std::string::npos)
      << n4["cause"];
  EXPECT_EQ(job["summary"]["running"], 1);
  EXPECT_EQ(job["summary"]["unreachable"], 2);
  EXPECT_EQ(job["summary"]["finished"], 1);
  EXPECT_EQ(job["summary"]["ranks"], 2);
  EXPECT_EQ(job["summary"]["samples_per_s"], 150.0);
  ASSERT_EQ(job["logs"].size(), 1u);
  EXPECT_EQ(job["logs"][0]["line"], "epoch 1 done");
  EXPECT_EQ(job["logs"][0]["addr"], "10.9.0.1");
  // One rank's lines on request, however many the others print.
  for (int i = 0; i < 300; ++i) events.Add({{"type", "log"}, {"rank", 0}, {"line", "noise"}});
  job = view.Snapshot();
  EXPECT_EQ(job["logs"].size(), 101u);  // the last 100 of rank 0 and rank 1's one
  EXPECT_EQ(job["logs"].back()["line"], "noise");
  job = view.Snapshot(1);
  ASSERT_EQ(job["logs"].size(), 1u) << job["logs"].dump();
  EXPECT_EQ(job["logs"][0]["line"], "epoch 1 done");

  // The agent that was running stops answering: still listed, LOST, its ranks kept.
  a1->Stop();
  job = view.Snapshot();
  EXPECT_EQ(job["nodes"][0]["state"], "LOST");
  EXPECT_NE(job["nodes"][0]["cause"].get<std::string>().find("no answer from its agent for"),
            std::string::npos) << job["nodes"][0]["cause"];
  ASSERT_EQ(job["nodes"][0]["ranks"].size(), 2u);
  EXPECT_EQ(job["nodes"][0]["ranks"][0]["state"], "LOST");
  EXPECT_EQ(job["logs"].size(), 101u);  // its lines too
}

// An agent answering with hand-made JSON (served on loopback from a thread of its own).
class FakeAgent {
 public:
  explicit FakeAgent(std::string body) : body_(std::move(body)) {
    server_.Get("/api/state", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(body_, "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    const Deadline ready = Deadline::AfterMs(10000);
    while (!server_.is_running() && !ready.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // startup handshake
    }
  }
  ~FakeAgent() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return Url(port_); }

 private:
  const std::string body_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(JobViewTest, LostCauseIsTheSurvivorsRecordNamingItAfterItWasLastSeen) {
  store::MemoryStore store;
  const Deadline d = Deadline::AfterMs(5000);
  const double now = WallSeconds();
  // The survivor recorded three round ends: one naming 10.9.0.1 long before (an earlier
  // incident), one naming 10.9.0.11 (another address sharing a prefix), the one that counts.
  json survivor = {
      {"agent", {{"host", "h"}, {"pid", 1}, {"state", "HEALTHY"}, {"ranks", json::array()}}},
      {"events",
       {{{"seq", 1}, {"time", now - 100}, {"type", "restart"}, {"round", 1},
         {"cause", "node 1 (h at 10.9.0.1) stopped sending heartbeats"}},
        {{"seq", 2}, {"time", now + 5}, {"type", "restart"}, {"round", 4},
         {"cause", "node 3 (h at 10.9.0.11) stopped sending heartbeats"}},
        {{"seq", 3}, {"time", now + 6}, {"type", "restart"}, {"round", 5},
         {"cause", "node 2 (h at 10.9.0.1) stopped sending heartbeats"}}}}};
  FakeAgent s(survivor.dump());
  auto victim = Agent({{"host", "h"}, {"pid", ::getpid()}, {"state", "HEALTHY"}}, nullptr);
  // Answers of the wrong shape: never an exception, the node is shown as not answering
  // properly or with what could be read.
  FakeAgent not_object("[1, 2, 3]");
  FakeAgent odd(R"({"agent": {"state": 5, "ranks": "x", "world_size": "2"},
                   "events": [1, {"type": 3, "seq": "x"}], "ranks": {"a": 1},
                   "system": {"gpus": {"available": true, "devices": [7]}}})");
  ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", s.url()}, {"addr", "10.9.0.5"}, {"pid", 1},
                                             {"host", "h"}}, d).ok());
  ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", Url(victim->port())}, {"addr", "10.9.0.1"},
                                             {"pid", ::getpid()}, {"host", "h"}}, d).ok());
  ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", not_object.url()}}, d).ok());
  ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", odd.url()}, {"addr", 7}}, d).ok());
  ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", "htps://x:1/"}}, d).ok());
  ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", "http://x:99999999999/"}}, d).ok());
  metrics::JobView view({.list = [&store] { return ReadDirectory(store, "job", Deadline::AfterMs(2000)); },
                         .reuse = Duration::zero()});
  json job = view.Snapshot();
  ASSERT_EQ(job["nodes"].size(), 6u) << job.dump(1);
  EXPECT_EQ(job["nodes"][1]["state"], "HEALTHY");
  EXPECT_EQ(job["nodes"][2]["state"], "UNREACHABLE");
  EXPECT_NE(job["nodes"][2]["cause"].get<std::string>().find("not an object"), std::string::npos);
  EXPECT_EQ(job["nodes"][3]["state"], "UNKNOWN");  // answered, but said nothing readable
  EXPECT_EQ(job["nodes"][4]["state"], "UNREACHABLE");
  EXPECT_NE(job["nodes"][4]["cause"].get<std::string>().find("not an http://"), std::string::npos);
  EXPECT_EQ(job["nodes"][5]["state"], "UNREACHABLE");

  victim->Stop();
  job = view.Snapshot();
  const json& lost = job["nodes"][1];
  EXPECT_EQ(lost["state"], "LOST");
  const std::string cause = lost["cause"];
  EXPECT_NE(cause.find("node 2 (h at 10.9.0.1)"), std::string::npos) << cause;
  EXPECT_NE(cause.find("round 5"), std::string::npos) << cause;
  EXPECT_EQ(job["summary"]["lost"], 1);
  EXPECT_EQ(job["summary"]["running"], 2);  // the survivor and the odd one
}

// An agent that answers one byte at a time, forever (until the test ends): its answer never
// completes, though each read gets a byte well within any read timeout.
class DribblingAgent {
 public:
  DribblingAgent() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" +
                                 std::string(1000, ' ');
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        for (size_t i = 0; c >= 0 && i < answer.size() && !stop_; ++i) {
          if (::send(c, &answer[i], 1, MSG_NOSIGNAL) != 1) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the attack's pace
        }
        if (c >= 0) ::close(c);
      }
    });
  }
  ~DribblingAgent() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return Url(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Hostile answers from one node (nested 100,000 deep; no pid; a byte at a time) leave the
// agent that asks running and the rest of the job shown, each poll within its bound.
TEST(JobViewTest, AHostileOrSlowNodeNeitherCrashesNorBlanksTheView) {
  store::MemoryStore store;
  const Deadline d = Deadline::AfterMs(5000);
  auto healthy = Agent({{"host", "h"}, {"pid", ::getpid()}, {"state", "HEALTHY"}}, nullptr);
  FakeAgent deep(std::string(100000, '[') + std::string(100000, ']'));
  FakeAgent deep_object(R"({"agent": {"host": "h", "pid": 5, "state": )" +
                        std::string(100000, '[') + std::string(100000, ']') + "}}");
  FakeAgent no_pid(R"({"agent": {"host": "h", "state": "HEALTHY"}})");
  DribblingAgent slow;
  ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", Url(healthy->port())}, {"addr", "10.9.0.1"},
                                             {"pid", ::getpid()}, {"host", "h"}}, d).ok());
  for (const std::string& url : {deep.url(), deep_object.url(), no_pid.url(), slow.url()}) {
    ASSERT_TRUE(PublishEndpoint(store, "job", {{"url", url}, {"pid", 5}, {"host", "h"}}, d).ok());
  }
  metrics::JobView view({.list = [&store] { return ReadDirectory(store, "job", Deadline::AfterMs(2000)); },
                         .fetch_timeout = std::chrono::milliseconds(500),
                         .reuse = Duration::zero()});
  for (int poll = 0; poll < 3; ++poll) {
    const auto started = SteadyClock::now();
    json job = view.Snapshot();
    EXPECT_LT(SecondsSince(started), 5.0) << "poll " << poll;
    ASSERT_EQ(job["nodes"].size(), 5u) << job.dump(1).substr(0, 2000);
    EXPECT_EQ(job["nodes"][0]["state"], "HEALTHY") << job["nodes"][0].dump();
    for (int n = 1; n <= 4; ++n) {
      EXPECT_EQ(job["nodes"][n]["state"], "UNREACHABLE") << job["nodes"][n].dump();
    }
    EXPECT_NE(job["nodes"][1]["cause"].get<std::string>().find("nested deeper"),
              std::string::npos) << job["nodes"][1]["cause"];
    EXPECT_NE(job["nodes"][3]["cause"].get<std::string>().find("another agent"),
              std::string::npos) << job["nodes"][3]["cause"];
    EXPECT_NE(job["nodes"][4]["cause"].get<std::string>().find("within 0.5 s"),
              std::string::npos) << job["nodes"][4]["cause"];
    EXPECT_EQ(job["summary"]["running"], 1);
  }
}

TEST(JobViewTest, FetchJsonRefusesWhatIsNotAnHttpAddress) {
  for (const char* url : {"htps://h:1/", "http://h:99999999999/", "ftp://x/", "", "http://:/"}) {
    auto got = metrics::FetchJson(url, std::chrono::milliseconds(200));
    EXPECT_FALSE(got.ok()) << url;
  }
}

}  // namespace
}  // namespace cohort::agent
