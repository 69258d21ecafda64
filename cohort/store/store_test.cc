// Store tests: one suite run against every Store implementation, then StoreServer-specific
// robustness tests (token, malformed and oversized frames, 1,000 concurrent clients).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <filesystem>
#include <functional>
#include <thread>

#include "cohort/base/strings.h"
#include "cohort/net/codec.h"
#include "cohort/net/socket.h"
#include "cohort/store/file_store.h"
#include "cohort/store/memory_store.h"
#include "cohort/store/store_contract.h"
#include "cohort/store/store_server.h"
#include "cohort/store/tcp_store.h"

namespace cohort::store {
namespace {

Deadline Soon() { return Deadline::AfterMs(5000); }

using contract::StoreContract;
using contract::StoreFactory;

class MemoryFactory : public StoreFactory {
 public:
  std::shared_ptr<Store> Make() override { return store_; }
  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
};

class FileFactory : public StoreFactory {
 public:
  FileFactory() {
    path_ = std::filesystem::temp_directory_path() / ("cohort-store-test-" + RandomHex(8));
  }
  ~FileFactory() override { std::filesystem::remove(path_); }
  std::shared_ptr<Store> Make() override {
    auto s = FileStore::Open(path_.string());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::shared_ptr<Store>(std::move(s).value());
  }
  std::filesystem::path path_;
};

class TcpFactory : public StoreFactory {
 public:
  TcpFactory() {
    auto server = StoreServer::Start({.host = "127.0.0.1", .port = 0, .token = token_});
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  std::shared_ptr<Store> Make() override {
    auto s = TcpStore::Connect({.host = "127.0.0.1", .port = server_->port(), .token = token_},
                               Soon());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::shared_ptr<Store>(std::move(s).value());
  }
  std::string token_ = RandomHex(16);
  std::unique_ptr<StoreServer> server_;
};

class PrefixFactory : public StoreFactory {
 public:
  std::shared_ptr<Store> Make() override {
    return std::make_shared<PrefixStore>("job", inner_.Make());
  }
  TcpFactory inner_;
};

INSTANTIATE_TEST_SUITE_P(AllStores, StoreContract,
                         ::testing::Values("memory", "file", "tcp", "prefix"),
                         [](const auto& info) { return info.param; });

TEST(PrefixStoreTest, KeysAreNamespaced) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore a("a", base), b("b", base);
  ASSERT_TRUE(a.Set("k", "1", Soon()).ok());
  ASSERT_TRUE(b.Set("k", "2", Soon()).ok());
  EXPECT_EQ(*a.Get("k", Soon()), "1");
  EXPECT_EQ(*base->Get("b/k", Soon()), "2");
}

class StoreServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StoreServer::Start(
        {.host = "127.0.0.1", .port = 0, .token = token_, .max_frame = 1 << 20});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  Result<std::unique_ptr<TcpStore>> Client(const std::string& token) {
    return TcpStore::Connect({.host = "127.0.0.1", .port = server_->port(), .token = token},
                             Soon());
  }
  // A client that has left a will on `key` with `grace`; null (the test failed) when it could
  // not connect or leave it.
  std::unique_ptr<TcpStore> ClientWithWill(const std::string& key, int grace_ms) {
    auto c = Client(token_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    const Status left = (*c)->LeaveWill(key, std::chrono::milliseconds(grace_ms), Soon());
    EXPECT_TRUE(left.ok()) << left.ToString();
    return left.ok() ? std::move(c).value() : nullptr;
  }
  net::Socket Raw() {
    auto s = net::Connect("127.0.0.1", server_->port(), Soon());
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  }
  // Waits until the server's statistics satisfy `reached` (false after 20 s); between looks
  // a 10 ms wait on `client`'s connection, not a sleep.
  bool AwaitStats(Store& client, const std::function<bool(const StoreServerStats&)>& reached) {
    for (auto until = Deadline::AfterMs(20000); !reached(server_->stats());) {
      if (until.expired()) return false;
      (void)client.Wait({"never"}, Deadline::AfterMs(10));
    }
    return true;
  }
  // True when the server closed `sock` (EOF) before the deadline.
  static bool ClosedByServer(net::Socket& sock) {
    char buf[256];
    for (;;) {
      Status st = sock.RecvAll(buf, 1, Deadline::AfterMs(5000));
      if (st.code() == StatusCode::kUnavailable) return true;
      if (!st.ok()) return false;
    }
  }
  std::string token_ = RandomHex(16);
  std::unique_ptr<StoreServer> server_;
};

TEST_F(StoreServerTest, WrongOrMissingTokenIsRefused) {
  auto wrong = Client("not-the-token");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(wrong.status().message().find("not-the-token"), std::string::npos);
  auto missing = Client("");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Client(token_).ok());
  EXPECT_GE(server_->stats().connections_rejected, 2);
}

// What answers at a store endpoint, told apart by where the connection stops (the launcher
// picks its exit code by it): this job's store, another job's, a program that accepts the
// connection but not the protocol, nothing at all.
TEST_F(StoreServerTest, ProbeTellsWhoIsAtTheEndpoint) {
  auto at = [&](int port, const std::string& token, int64_t ms) {
    return TcpStore::Probe({.host = "127.0.0.1", .port = port, .token = token},
                           Deadline::AfterMs(ms));
  };
  EXPECT_EQ(at(server_->port(), token_, 5000).peer, StorePeer::kCohortStore);
  auto wrong = at(server_->port(), "not-the-token", 5000);
  EXPECT_EQ(wrong.peer, StorePeer::kWrongToken);
  EXPECT_EQ(wrong.status.code(), StatusCode::kPermissionDenied);
  // A listener that never answers (the kernel completes the connection).
  auto mute = net::Listen({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(mute.ok());
  auto other = at(*mute->LocalPort(), token_, 300);
  EXPECT_EQ(other.peer, StorePeer::kOtherProgram) << other.status.ToString();
  // A port bound but not listening: every connection is refused.
  auto reserved = net::ReservePort("127.0.0.1", 0);
  ASSERT_TRUE(reserved.ok());
  auto nothing = at(*reserved->LocalPort(), token_, 300);
  EXPECT_EQ(nothing.peer, StorePeer::kNothing) << nothing.status.ToString();
}

// A scripted server: the answer to a request the client gave up on arrives together with
// the answer to its next request (one segment). The client must skip the first and return
// the second at once, on the same connection.
TEST(TcpStoreTest, LateAnswerAndNextAnswerInOneSegment) {
  auto listener = net::Listen({.host = "127.0.0.1", .port = 0});
  ASSERT_TRUE(listener.ok());
  std::atomic<int> accepted{0};
  std::thread server([&] {
    pollfd p{listener->fd(), POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return;
    net::Socket conn(::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC));
    ++accepted;
    auto id_of = [&](std::string* body) {
      EXPECT_TRUE(net::ReadFrame(conn, body, 1 << 20, Soon()).ok());
      net::Reader r(*body);
      uint8_t op = 0;
      uint64_t id = 0;
      EXPECT_TRUE(r.U8(&op) && r.U64(&id));
      return id;
    };
    std::string body;
    net::Writer hello;
    const std::string ok_hello = hello.U64(id_of(&body)).U8(0).Finish();
    ASSERT_TRUE(conn.SendAll(ok_hello.data(), ok_hello.size(), Soon()).ok());
    const uint64_t first = id_of(&body);   // not answered in time
    const uint64_t second = id_of(&body);  // sent once the client gave up on the first
    net::Writer late, answer;
    std::string both = late.U64(first).U8(0).Str("late").Finish();
    both += answer.U64(second).U8(0).Str("v2").Finish();
    ASSERT_TRUE(conn.SendAll(both.data(), both.size(), Soon()).ok());
    char byte;
    (void)conn.RecvAll(&byte, 1, Deadline::AfterMs(5000));  // until the client closes
  });
  auto client = TcpStore::Connect(
      {.host = "127.0.0.1", .port = *listener->LocalPort(), .token = ""}, Soon());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->Get("k1", Deadline::AfterMs(200)).status().code(),
            StatusCode::kDeadlineExceeded);
  auto start = SteadyClock::now();
  auto second = (*client)->Get("k2", Deadline::AfterMs(4000));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(*second, "v2");
  EXPECT_LT(SecondsSince(start), 2.0) << "the answer sat in the client's buffer";
  client->reset();
  server.join();
  EXPECT_EQ(accepted, 1);
}

TEST_F(StoreServerTest, RequestsBeforeHelloAreRefused) {
  net::Socket sock = Raw();
  net::Writer w;
  w.U8(static_cast<uint8_t>(protocol::Op::kSet)).U64(1).Str("k").Str("v");
  auto& frame = w.Finish();
  ASSERT_TRUE(sock.SendAll(frame.data(), frame.size(), Soon()).ok());
  EXPECT_TRUE(ClosedByServer(sock));
}

// HELLO frames: `token` each, all sent in one write.
std::string Hellos(const std::vector<std::string>& tokens) {
  std::string out;
  uint64_t id = 1;
  for (const auto& token : tokens) {
    net::Writer w;
    w.U8(static_cast<uint8_t>(protocol::Op::kHello)).U64(id++).Str(std::string(protocol::kMagic))
        .U32(protocol::kVersion).Str(token);
    out += w.Finish();
  }
  return out;
}

// A wrong HELLO ends the connection: the guesses pipelined after it are not looked at, and
// a right token after a wrong one does not authenticate (2,000 guesses in 30 ms before).
TEST_F(StoreServerTest, PipelinedHellosAfterAWrongOneAreNotEvaluated) {
  net::Socket sock = Raw();
  std::vector<std::string> tokens(500, "guess");
  tokens.push_back(token_);
  const std::string frames = Hellos(tokens);
  const auto rejected_before = server_->stats().connections_rejected;
  ASSERT_TRUE(sock.SendAll(frames.data(), frames.size(), Soon()).ok());
  EXPECT_TRUE(ClosedByServer(sock));
  EXPECT_EQ(server_->stats().connections_rejected - rejected_before, 1);
  EXPECT_EQ(server_->stats().connections_unauthenticated, 0);
}

// Strangers that hold every pre-authentication slot are shed at random as new connections
// arrive, so the job's clients still get in (530 silent connections locked out 121 of 121
// HELLOs before).
TEST(StoreServerSheddingTest, SilentStrangersNeverLockOutTheJob) {
  const std::string token = RandomHex(16);
  auto server = StoreServer::Start({.host = "127.0.0.1", .port = 0, .token = token,
                                    .max_unauthenticated = 16}).value();
  std::vector<net::Socket> strangers;
  for (int i = 0; i < 40; ++i) {
    auto s = net::Connect("127.0.0.1", server->port(), Soon());
    ASSERT_TRUE(s.ok());
    strangers.push_back(std::move(*s));
  }
  int joined = 0;
  for (int i = 0; i < 20; ++i) {
    auto client = TcpStore::Connect({.host = "127.0.0.1", .port = server->port(), .token = token},
                                    Soon());
    if (client.ok() && (*client)->Set("k", std::to_string(i), Soon()).ok()) ++joined;
    // More strangers between the job's clients.
    for (int j = 0; j < 4; ++j) {
      auto s = net::Connect("127.0.0.1", server->port(), Soon());
      if (s.ok()) strangers.push_back(std::move(*s));
    }
  }
  EXPECT_EQ(joined, 20);
  EXPECT_LE(server->stats().connections_unauthenticated, 16);
}

TEST_F(StoreServerTest, MalformedAndOversizedFramesCloseOnlyThatClient) {
  auto good = Client(token_);
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE((*good)->Set("before", "1", Soon()).ok());
  // A blocked waiter on another connection must survive the bad clients.
  auto waiter = Client(token_);
  ASSERT_TRUE(waiter.ok());
  std::thread t([&] { EXPECT_EQ(*(*waiter)->Get("after", Soon()), "2"); });

  net::Socket garbage = Raw();
  std::string junk("\x03\x00\x00\x00xyz", 7);
  ASSERT_TRUE(garbage.SendAll(junk.data(), junk.size(), Soon()).ok());
  EXPECT_TRUE(ClosedByServer(garbage));

  net::Socket huge = Raw();
  std::string header = "\xff\xff\xff\x7f";
  ASSERT_TRUE(huge.SendAll(header.data(), header.size(), Soon()).ok());
  EXPECT_TRUE(ClosedByServer(huge));

  ASSERT_TRUE((*good)->Set("after", "2", Soon()).ok());
  t.join();
  EXPECT_EQ(*(*good)->Get("before", Soon()), "1");
}

// ADD past INT64_MAX is refused (it wrapped before); the key keeps its value.
TEST_F(StoreServerTest, AddOverflowIsRefused) {
  auto c = Client(token_);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Add("n", INT64_MAX - 1, Soon()).ok());
  auto over = (*c)->Add("n", 2, Soon());
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument) << over.status().ToString();
  EXPECT_EQ(*(*c)->Add("n", 0, Soon()), INT64_MAX - 1);
}

// A wait's timeout_ms: -1 is "none", below that is malformed (it used to wait forever), and
// a huge one is capped instead of overflowing into "already expired".
TEST_F(StoreServerTest, WaitTimeoutsAreBounded) {
  auto hello = [&](net::Socket& sock) {
    net::Writer w;
    w.U8(static_cast<uint8_t>(protocol::Op::kHello)).U64(1).Str(protocol::kMagic);
    w.U32(protocol::kVersion).Str(token_);
    auto& frame = w.Finish();
    ASSERT_TRUE(sock.SendAll(frame.data(), frame.size(), Soon()).ok());
    std::string reply;
    ASSERT_TRUE(net::ReadFrame(sock, &reply, 1 << 20, Soon()).ok());
  };
  auto get = [&](net::Socket& sock, int64_t timeout_ms) {
    net::Writer w;
    w.U8(static_cast<uint8_t>(protocol::Op::kGet)).U64(2).Str("absent").I64(timeout_ms);
    auto& frame = w.Finish();
    ASSERT_TRUE(sock.SendAll(frame.data(), frame.size(), Soon()).ok());
  };
  net::Socket negative = Raw();
  hello(negative);
  get(negative, -2);
  EXPECT_TRUE(ClosedByServer(negative));

  net::Socket huge = Raw();
  hello(huge);
  get(huge, INT64_MAX);
  // Still parked a moment later: no reply (an overflowed deadline answered at once).
  char byte;
  EXPECT_EQ(huge.RecvAll(&byte, 1, Deadline::AfterMs(300)).code(),
            StatusCode::kDeadlineExceeded);
  auto setter = Client(token_);
  ASSERT_TRUE(setter.ok());
  ASSERT_TRUE((*setter)->Set("absent", "now", Soon()).ok());
  std::string reply;
  ASSERT_TRUE(net::ReadFrame(huge, &reply, 1 << 20, Soon()).ok());
  net::Reader r(reply);
  uint64_t id;
  uint8_t code;
  std::string value;
  ASSERT_TRUE(r.U64(&id) && r.U8(&code) && r.Str(&value));
  EXPECT_EQ(code, 0);
  EXPECT_EQ(value, "now");
}

TEST_F(StoreServerTest, BeatsAndTimedOutWaitsKeepTheirConnection) {
  auto c = Client(token_);
  ASSERT_TRUE(c.ok());
  for (int i = 1; i <= 20; ++i) {
    auto r = (*c)->Beat("hb", {"hb"}, {"next"}, Deadline::AfterMs(30));
    // The server's answer normally beats the deadline; on a loaded machine (sanitizers,
    // parallel tests) it may come late, which the client must also survive without a
    // reconnection (the late answer is skipped by its id).
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
      continue;
    }
    EXPECT_EQ(r->peeked[0], std::to_string(i));
    EXPECT_FALSE(r->waited);
    EXPECT_EQ((*c)->Wait({"absent"}, Deadline::AfterMs(30)).code(),
              StatusCode::kDeadlineExceeded);
  }
  // Timeouts, answered in time or late, cost no reconnection.
  EXPECT_EQ(server_->stats().connections_accepted, 1);
}

TEST_F(StoreServerTest, BeatWaitsForAnyOfItsKeys) {
  auto c = Client(token_);
  ASSERT_TRUE(c.ok());
  std::thread writer([&] {
    auto w = Client(token_);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Set("second", "here", Soon()).ok());
  });
  auto r = (*c)->Beat("", {}, {"first", "second"}, Deadline::AfterMs(20000));
  writer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->waited, "here");
  EXPECT_EQ(r->waited_index, 1u);
  // Both exist: the first in the list is answered.
  ASSERT_TRUE((*c)->Set("first", "one", Soon()).ok());
  r = (*c)->Beat("", {}, {"first", "second"}, Soon());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->waited, "one");
  EXPECT_EQ(r->waited_index, 0u);
  // Stores without a native any-wait refuse several keys rather than wait for one.
  MemoryStore memory;
  EXPECT_EQ(memory.Beat("", {}, {"a", "b"}, Soon()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(StoreServerTest, BeatSaysHowLongAgoEachPeekedCounterWasBeaten) {
  auto peer = Client(token_);
  ASSERT_TRUE(peer.ok());
  auto me = Client(token_);
  ASSERT_TRUE(me.ok());
  // The server dates the beat between the call's start and its answer: bound the age by
  // the time since the call started (the answer may come milliseconds later on a loaded
  // machine).
  const auto beaten = SteadyClock::now();
  ASSERT_TRUE((*peer)->Beat("hb-peer", {}, {"next"}, Deadline::AfterMs(10)).ok());
  ASSERT_TRUE((*me)->Set("plain", "1", Soon()).ok());
  // The peer's counter as this client sees it some time later.
  EXPECT_EQ((*me)->Wait({"never"}, Deadline::AfterMs(150)).code(), StatusCode::kDeadlineExceeded);
  auto r = (*me)->Beat("hb-me", {"hb-peer", "plain", "absent"}, {"next"}, Deadline::AfterMs(10));
  const double elapsed_ms = 1000.0 * SecondsSince(beaten);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->peeked_age_ms.size(), 3u);
  EXPECT_GE(r->peeked_age_ms[0], 140);
  EXPECT_LE(r->peeked_age_ms[0], elapsed_ms + 1);
  // A key never beaten (set otherwise, or absent) has no age.
  EXPECT_EQ(r->peeked_age_ms[1], -1);
  EXPECT_EQ(r->peeked_age_ms[2], -1);
}

TEST_F(StoreServerTest, WillIsSetWhenItsConnectionEnds) {
  auto watcher = Client(token_);
  ASSERT_TRUE(watcher.ok());
  auto owner = ClientWithWill("gone", 200);
  ASSERT_TRUE(owner);
  // While the connection lives, nothing is set.
  EXPECT_EQ((*watcher)->Wait({"gone"}, Deadline::AfterMs(300)).code(),
            StatusCode::kDeadlineExceeded);
  const auto closed = SteadyClock::now();
  owner.reset();  // the process's connection ends (as when it dies)
  auto why = (*watcher)->Get("gone", Deadline::AfterMs(20000));
  ASSERT_TRUE(why.ok()) << why.status().ToString();
  EXPECT_EQ(*why, "its store connection closed");
  EXPECT_GE(SecondsSince(closed), 0.19) << "the grace was not given";
  EXPECT_EQ(server_->stats().wills_fired, 1);
  // A will does not overwrite a key set meanwhile.
  ASSERT_TRUE((*watcher)->Set("taken", "first word", Soon()).ok());
  auto other = ClientWithWill("taken", 0);
  ASSERT_TRUE(other);
  other.reset();
  ASSERT_TRUE((*watcher)->LeaveWill("sentinel", std::chrono::milliseconds(0), Soon()).ok());
  // Fired wills are counted before their key is looked at: wait for the second one.
  ASSERT_TRUE(AwaitStats(**watcher, [](const StoreServerStats& st) {
    return st.wills_fired >= 2;
  }));
  EXPECT_EQ(*(*watcher)->Get("taken", Soon()), "first word");
  // Wills of closed connections only: the sentinel's owner is still connected.
  EXPECT_FALSE(*(*watcher)->Check({"sentinel"}, Soon()));
}

TEST_F(StoreServerTest, WillTakenUpWithinItsGraceDoesNotFire) {
  auto watcher = Client(token_);
  ASSERT_TRUE(watcher.ok());
  // One client leaves the will and its connection ends; another (the same node
  // reconnected) leaves it again within the grace: it does not fire.
  auto first = ClientWithWill("gone", 1500);
  ASSERT_TRUE(first);
  const int64_t open = server_->stats().connections_open;
  first.reset();
  // The server has seen the end (the will is pending) before the will is left again.
  ASSERT_TRUE(AwaitStats(**watcher, [&](const StoreServerStats& st) {
    return st.connections_open < open;
  }));
  auto second = ClientWithWill("gone", 1500);
  ASSERT_TRUE(second);
  EXPECT_EQ((*watcher)->Wait({"gone"}, Deadline::AfterMs(2500)).code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(server_->stats().wills_fired, 0);
  // The new owner's end fires it.
  second.reset();
  EXPECT_EQ(*(*watcher)->Get("gone", Deadline::AfterMs(20000)), "its store connection closed");
}

TEST_F(StoreServerTest, ClientLeavesItsWillsAgainAfterReconnecting) {
  const int port = server_->port();
  auto owner = ClientWithWill("gone", 100);
  ASSERT_TRUE(owner);
  // The store restarts on the same port (a stopped server fires no will): the client's
  // next call reconnects and leaves the will on the new server.
  server_->Stop();
  auto restarted = StoreServer::Start({.host = "127.0.0.1", .port = port, .token = token_});
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  server_ = std::move(restarted).value();
  Status reconnected = owner->Set("x", "1", Soon());
  if (!reconnected.ok()) reconnected = owner->Set("x", "1", Soon());  // the first may see the old end
  ASSERT_TRUE(reconnected.ok()) << reconnected.ToString();
  auto watcher = Client(token_);
  ASSERT_TRUE(watcher.ok());
  owner.reset();
  EXPECT_EQ(*(*watcher)->Get("gone", Deadline::AfterMs(20000)), "its store connection closed");
}

TEST_F(StoreServerTest, ManyWaitersOnOneKeyTimeOutOrWake) {
  RaiseFileLimit();
  constexpr int kEach = 60;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < 2 * kEach; ++i) {
    auto c = Client(token_);
    ASSERT_TRUE(c.ok());
    clients.push_back(std::move(c).value());
  }
  std::vector<Status> results(2 * kEach);
  std::vector<std::thread> short_waits, long_waits;
  for (int i = 0; i < kEach; ++i) {
    short_waits.emplace_back(
        [&, i] { results[i] = clients[i]->Wait({"key"}, Deadline::AfterMs(100)); });
    long_waits.emplace_back([&, i] {
      results[kEach + i] = clients[kEach + i]->Wait({"key"}, Deadline::AfterMs(60000));
    });
  }
  for (auto& t : short_waits) t.join();
  // The short waits timed out (and left the key's list) while the long ones stay parked.
  auto setter = Client(token_);
  ASSERT_TRUE(setter.ok());
  ASSERT_TRUE((*setter)->Set("key", "v", Soon()).ok());
  for (auto& t : long_waits) t.join();
  for (int i = 0; i < kEach; ++i) {
    EXPECT_EQ(results[i].code(), StatusCode::kDeadlineExceeded) << i;
    EXPECT_TRUE(results[kEach + i].ok()) << results[kEach + i].ToString();
  }
}

TEST_F(StoreServerTest, ServesOneThousandConcurrentClients) {
  RaiseFileLimit();
  constexpr int kClients = 1000;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kClients; ++i) {
    auto c = Client(token_);
    ASSERT_TRUE(c.ok()) << i << ": " << c.status().ToString();
    clients.push_back(std::move(c).value());
  }
  EXPECT_EQ(server_->stats().connections_open, kClients);
  // Every client blocks on a barrier key from its own thread; one Set releases them all.
  // The threads only count (no ASSERT off the main thread), and the main thread always
  // sets "go" and joins them, so a slow run (TSan, a loaded machine) fails with a message
  // instead of aborting the binary with live threads.
  constexpr int kThreads = 8;
  const auto generous = [] { return Deadline::AfterMs(60000); };
  std::atomic<int> arrived{0}, released{0};
  std::mutex failures_mu;
  std::vector<std::string> failures;
  auto fail = [&](int client, const Status& s) {
    std::lock_guard<std::mutex> lock(failures_mu);
    failures.push_back(fmt::format("client {}: {}", client, s.ToString()));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kClients; i += kThreads) {
        auto r = clients[i]->Add("arrived", 1, generous());
        if (r.ok()) {
          arrived++;
        } else {
          fail(i, r.status());
        }
      }
      for (int i = t; i < kClients; i += kThreads) {
        Status s = clients[i]->Wait({"go"}, generous());
        if (s.ok()) {
          released++;
        } else {
          fail(i, s);
        }
      }
    });
  }
  auto setter = Client(token_);
  Status set = setter.ok() ? (*setter)->Set("go", "1", generous()) : setter.status();
  for (auto& t : threads) t.join();
  ASSERT_TRUE(set.ok()) << set.ToString();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: " << failures[0];
  EXPECT_EQ(arrived, kClients);
  EXPECT_EQ(released, kClients);
  auto total = (*setter)->Add("arrived", 0, generous());
  ASSERT_TRUE(total.ok()) << total.status().ToString();
  EXPECT_EQ(*total, kClients);
}

TEST_F(StoreServerTest, ClientSeesServerDeathAsUnavailable) {
  auto client = Client(token_);
  ASSERT_TRUE(client.ok());
  std::thread t([&] {
    auto r = (*client)->Get("never", Deadline::AfterMs(10000));
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  });
  server_->Stop();
  t.join();
}

TEST(FileStoreTest, TornTailIsIgnoredUntilComplete) {
  auto path = std::filesystem::temp_directory_path() / ("cohort-torn-" + RandomHex(8));
  {
    auto s = FileStore::Open(path.string());
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Set("a", "1", Soon()).ok());
  }
  {
    FILE* f = std::fopen(path.c_str(), "ab");
    std::fwrite("\x40\x00\x00\x00\x01", 1, 5, f);  // a record header with no body yet
    std::fclose(f);
  }
  auto s = FileStore::Open(path.string());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*(*s)->Get("a", Soon()), "1");
  std::filesystem::remove(path);
}

}  // namespace

namespace contract {
std::unique_ptr<StoreFactory> MakeFactory(const std::string& kind) {
  if (kind == "memory") return std::make_unique<MemoryFactory>();
  if (kind == "file") return std::make_unique<FileFactory>();
  if (kind == "tcp") return std::make_unique<TcpFactory>();
  return std::make_unique<PrefixFactory>();
}

}  // namespace contract
}  // namespace cohort::store
