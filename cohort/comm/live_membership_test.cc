// LiveMembership against a real store server and the agent's side of the channel written by
// hand: a notice interrupts a blocked collective and the group re-forms there; a transport
// failure is reported as a lost peer; a newer notice abandons a formation that cannot
// complete (the second loss during a reconfiguration).
#include "cohort/comm/live_membership.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "cohort/base/file.h"
#include "cohort/base/temp_dir.h"
#include "cohort/store/store_server.h"

namespace cohort::comm {
namespace {

namespace mc = membership_channel;

constexpr char kSecret[] = "0123456789abcdef";

class LiveMembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::StoreServerOptions o;
    o.host = "127.0.0.1";
    auto server = store::StoreServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  // The environment of a worker at `rank` of `world` in round 0, with its own channel.
  WorkerEnv Env(int rank, int world, const std::string& dir) {
    WorkerEnv env;
    env.rank = rank;
    env.world_size = world;
    env.round = 0;
    env.store.kind = JobStoreAccess::Kind::kTcp;
    env.store.addr = "127.0.0.1";
    env.store.port = server_->port();
    env.store.round_prefix = "r0";
    env.membership_dir = dir;
    env.membership_secret = kSecret;
    return env;
  }

  std::unique_ptr<Communicator> Join(const WorkerEnv& env) {
    auto connection = ConnectJobStore(env.store, Deadline::AfterMs(10000));
    EXPECT_TRUE(connection.ok()) << connection.status().ToString();
    CommOptions o;
    o.transport = "tcp";
    o.timeout = std::chrono::seconds(60);
    auto c = Communicator::Create(std::make_shared<store::PrefixStore>("r0", *connection),
                                  env.rank, env.world_size, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // A worker alone in round 0 (rank 0 of 1) with its own channel, its membership live.
  struct Solo {
    TempDir dir;
    WorkerEnv env;
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<LiveMembership> live;
  };
  void StartSolo(Solo* s) {
    s->env = Env(0, 1, s->dir.path());
    s->comm = Join(s->env);
    ASSERT_TRUE(s->comm);
    auto live = LiveMembership::Start(s->env, s->comm.get());
    ASSERT_TRUE(live.ok() && *live);
    s->live = std::move(*live);
  }

  static MembershipNotice Notice(int64_t round, int rank, int world) {
    MembershipNotice n;
    n.round = round;
    n.rank = rank;
    n.world_size = world;
    n.store_prefix = "r" + std::to_string(round);
    return n;
  }

  std::unique_ptr<store::StoreServer> server_;
};

TEST_F(LiveMembershipTest, ANoticeInterruptsAStepAndTheGroupReformsThere) {
  TempDir d0, d1;
  const WorkerEnv e0 = Env(0, 2, d0.path()), e1 = Env(1, 2, d1.path());
  std::unique_ptr<Communicator> c0, c1;
  std::thread t([&] { c1 = Join(e1); });
  c0 = Join(e0);
  t.join();
  ASSERT_TRUE(c0 && c1);
  auto l0 = LiveMembership::Start(e0, c0.get());
  auto l1 = LiveMembership::Start(e1, c1.get());
  ASSERT_TRUE(l0.ok() && l1.ok() && *l0 && *l1);
  EXPECT_TRUE(mc::IsReady(d0.path(), 0));
  EXPECT_TRUE(mc::IsReady(d1.path(), 0));
  // Rank 1 enters an allreduce rank 0 never joins; the new membership (ranks swapped)
  // interrupts it at once, with "membership changed", not after the 60 s timeout.
  std::vector<float> buf(1024, 1.0f);
  auto blocked = c1->AllReduce(buf.data(), buf.data(), buf.size(), DataType::kF32,
                               ReduceOp::kSum, Exec::kAsync);
  ASSERT_TRUE(mc::WriteNotice(d1.path(), 0, Notice(1, 0, 2), kSecret).ok());
  Status st = blocked->Wait(Deadline::AfterMs(20000));
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("membership changed"), std::string::npos) << st.ToString();
  // (Rank 0's agent announces a moment later; had it been first, rank 1 would have seen
  // its connection close: a transport error, which AwaitChange handles too.)
  ASSERT_TRUE(mc::WriteNotice(d0.path(), 0, Notice(1, 1, 2), kSecret).ok());
  // Both re-form in round 1; a notice-caused abort is not reported as a lost peer.
  Status r0, r1;
  std::thread t0([&] {
    auto n = (*l0)->AwaitChange(Status(StatusCode::kAborted, "interrupted"),
                                Deadline::AfterMs(20000));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    r0 = (*l0)->Reform(Deadline::AfterMs(20000));
  });
  auto n1 = (*l1)->AwaitChange(st, Deadline::AfterMs(20000));
  ASSERT_TRUE(n1.ok()) << n1.status().ToString();
  EXPECT_EQ(n1->rank, 0);
  r1 = (*l1)->Reform(Deadline::AfterMs(20000));
  t0.join();
  ASSERT_TRUE(r0.ok()) << r0.ToString();
  ASSERT_TRUE(r1.ok()) << r1.ToString();
  EXPECT_EQ(c0->rank(), 1);
  EXPECT_EQ(c1->rank(), 0);
  EXPECT_EQ((*l0)->round(), 1);
  EXPECT_EQ(mc::ReadFormed(d0.path(), 0), 1);
  EXPECT_EQ(mc::ReadFormed(d1.path(), 0), 1);
  EXPECT_FALSE(mc::ReadLost(d1.path(), 0, kSecret).ok());
  // The re-formed group works.
  float v0 = 1, v1 = 2;
  std::thread t2([&] {
    EXPECT_TRUE(c0->AllReduce(&v0, &v0, 1, DataType::kF32, ReduceOp::kSum)->Wait().ok());
  });
  EXPECT_TRUE(c1->AllReduce(&v1, &v1, 1, DataType::kF32, ReduceOp::kSum)->Wait().ok());
  t2.join();
  EXPECT_EQ(v0, 3);
  EXPECT_EQ(v1, 3);
  EXPECT_FALSE((*l0)->Pending());
}

TEST_F(LiveMembershipTest, ATransportFailureIsReportedToTheAgentAsALostPeer) {
  Solo w;
  ASSERT_NO_FATAL_FAILURE(StartSolo(&w));
  Result<MembershipNotice> next = Status(StatusCode::kInternal, "not yet");
  std::thread waiter([&] {
    next = w.live->AwaitChange(Status(StatusCode::kUnavailable,
                                      "allreduce #3: rank 1 (at 10.0.0.2:4001) closed its "
                                      "connection (did it exit or crash?)"),
                               Deadline::AfterMs(20000));
  });
  // The agent's side: the report arrives, then the agent announces the next round.
  Result<LostPeerReport> report = NotFound("no report");
  for (Deadline until = Deadline::AfterMs(20000); !report.ok() && !until.expired();) {
    report = mc::ReadLost(w.dir.path(), 0, kSecret);
    if (!report.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->round, 0);
  EXPECT_EQ(report->reason,
            "allreduce #3: rank 1 (at 10.0.0.2:4001) closed its connection (did it exit or "
            "crash?)");
  EXPECT_EQ(report->peer, 1);  // the agent ends the round for that rank's node
  ASSERT_TRUE(mc::WriteNotice(w.dir.path(), 0, Notice(1, 0, 1), kSecret).ok());
  waiter.join();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->round, 1);
}

TEST_F(LiveMembershipTest, ANewerNoticeAbandonsAFormationThatCannotComplete) {
  Solo w;
  ASSERT_NO_FATAL_FAILURE(StartSolo(&w));
  // Round 1 expects a peer that was lost meanwhile: its formation would wait 60 s.
  ASSERT_TRUE(mc::WriteNotice(w.dir.path(), 0, Notice(1, 0, 2), kSecret).ok());
  ASSERT_TRUE(
      w.live->AwaitChange(Status(StatusCode::kAborted, "notice"), Deadline::AfterMs(20000)).ok());
  const auto started = SteadyClock::now();
  Status formed;
  std::thread reform([&] { formed = w.live->Reform(Deadline::AfterMs(60000)); });
  // Once the formation is under way (this rank published its host in round 1)...
  auto probe = ConnectJobStore(w.env.store, Deadline::AfterMs(10000));
  ASSERT_TRUE(probe.ok());
  ASSERT_TRUE((*probe)->Wait({"r1/comm/default/host/0"}, Deadline::AfterMs(20000)).ok());
  // ... round 2, alone: the stale formation is aborted and Reform forms round 2 instead.
  ASSERT_TRUE(mc::WriteNotice(w.dir.path(), 0, Notice(2, 0, 1), kSecret).ok());
  reform.join();
  ASSERT_TRUE(formed.ok()) << formed.ToString();
  EXPECT_LT(SecondsSince(started), 30.0);
  EXPECT_EQ(w.live->round(), 2);
  EXPECT_EQ(w.comm->size(), 1);
  EXPECT_EQ(mc::ReadFormed(w.dir.path(), 0), 2);
  float v = 4;
  EXPECT_TRUE(w.comm->AllReduce(&v, &v, 1, DataType::kF32, ReduceOp::kSum)->Wait().ok());
}

TEST(MembershipChannelTest, FilesRoundTripAndNamesParse) {
  TempDir d;
  const MembershipNotice n{.round = 7, .rank = 3, .world_size = 5, .group_rank = 1,
                           .group_world_size = 2, .store_prefix = "rdzv/x/r7/w",
                           .restart_count = 2, .master_addr = "10.0.0.1", .master_port = 29500};
  ASSERT_TRUE(mc::WriteNotice(d.path(), 1, n, kSecret).ok());
  auto back = mc::ReadNotice(d.path(), 1, kSecret);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ToJson(), n.ToJson());
  EXPECT_EQ(mc::ReadNotice(d.path(), 0, kSecret).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(mc::IsReady(d.path(), 1));
  ASSERT_TRUE(mc::MarkReady(d.path(), 1).ok());
  EXPECT_TRUE(mc::IsReady(d.path(), 1));
  EXPECT_EQ(mc::ReadFormed(d.path(), 1), std::nullopt);
  ASSERT_TRUE(mc::WriteFormed(d.path(), 1, 7).ok());
  EXPECT_EQ(mc::ReadFormed(d.path(), 1), 7);
  EXPECT_EQ(mc::FileOf("notice.3"), std::make_pair(mc::File::kNotice, 3));
  EXPECT_EQ(mc::FileOf("lost.12"), std::make_pair(mc::File::kLost, 12));
  EXPECT_EQ(mc::FileOf("notice.3.tmp.77"), std::nullopt);  // a write in progress
  EXPECT_EQ(mc::FileOf("other.1"), std::nullopt);
  EXPECT_EQ(mc::FileOf("ready"), std::nullopt);
  ASSERT_TRUE(ReplaceFile(mc::PathOf(d.path(), mc::File::kLost, 0), "{not json").ok());
  EXPECT_EQ(mc::ReadLost(d.path(), 0, kSecret).status().code(), StatusCode::kDataLoss);
}

// The channel as another local user would attack it (the worker's own checks; the agent
// makes the directory with mkdtemp, so its name cannot be prepared in advance).
TEST(MembershipChannelTest, TheLostPeerIsReadFromTheTransportsError) {
  EXPECT_EQ(LostPeerIn("ring: rank 12 (at 10.1.2.3:5) closed its connection"), 12);
  EXPECT_EQ(LostPeerIn("x: sending to rank 0 (at h:1) failed: Broken pipe"), 0);
  EXPECT_EQ(LostPeerIn("rank 3 of 4 timed out; rank 7 (at h:2) closed"), 7);
  EXPECT_EQ(LostPeerIn("rank 1 closed its connection"), -1);
  EXPECT_EQ(LostPeerIn("rank (at h)"), -1);
  EXPECT_EQ(LostPeerIn(""), -1);
  // gloo names the peer's address only.
  EXPECT_EQ(LostPeerAddressIn("[./gloo/transport/tcp/pair.cc:589] Read error "
                              "[10.231.206.3]:22451: Connection reset by peer"),
            "10.231.206.3");
  EXPECT_EQ(LostPeerAddressIn("Connection closed by peer [fd00::3]:1234"), "fd00::3");
  EXPECT_EQ(LostPeerAddressIn("[./gloo/transport/tcp/pair.cc:589] Timed out"), "");
  EXPECT_EQ(LostPeerAddressIn("[10.0.0.1] no port"), "");
  EXPECT_EQ(LostPeerAddressIn("NCCL error: remote process exited"), "");
}

TEST(MembershipChannelTest, AMessageWithoutTheAgentsSecretIsRefused) {
  TempDir d;
  MembershipNotice n;
  n.round = 3;
  n.master_addr = "10.9.9.9";
  ASSERT_TRUE(mc::WriteNotice(d.path(), 0, n, "not-the-secret").ok());
  EXPECT_EQ(mc::ReadNotice(d.path(), 0, kSecret).status().code(),
            StatusCode::kPermissionDenied);
  ASSERT_TRUE(ReplaceFile(mc::PathOf(d.path(), mc::File::kNotice, 0), n.ToJson()).ok());
  EXPECT_EQ(mc::ReadNotice(d.path(), 0, kSecret).status().code(),
            StatusCode::kPermissionDenied);
  EXPECT_EQ(mc::ReadNotice(d.path(), 0, "").status().code(), StatusCode::kPermissionDenied);
  ASSERT_TRUE(mc::WriteLost(d.path(), 0, LostPeerReport{.round = 1}, "forged").ok());
  EXPECT_EQ(mc::ReadLost(d.path(), 0, kSecret).status().code(), StatusCode::kPermissionDenied);
  // A malformed message is quoted in the error only in part (it goes to a log).
  ASSERT_TRUE(ReplaceFile(mc::PathOf(d.path(), mc::File::kNotice, 1),
                          "{" + std::string(1 << 20, 'x')).ok());
  auto bad = mc::ReadNotice(d.path(), 1, kSecret);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_LT(bad.status().message().size(), 1000u);
}

TEST(MembershipChannelTest, ADirectoryOthersCanWriteIsRefused) {
  TempDir d;
  ASSERT_TRUE(mc::WriteNotice(d.path(), 0, MembershipNotice{}, kSecret).ok());
  std::filesystem::permissions(d.path(), std::filesystem::perms::all);  // 0777
  EXPECT_EQ(mc::ReadNotice(d.path(), 0, kSecret).status().code(),
            StatusCode::kPermissionDenied);
  Status ready = mc::MarkReady(d.path(), 0);
  EXPECT_EQ(ready.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(ready.message().find("mode 777"), std::string::npos) << ready.ToString();
  // A link to a private directory is not one.
  std::filesystem::permissions(d.path(), std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace);
  const std::string link = d.path() + "-link";
  std::filesystem::create_directory_symlink(d.path(), link);
  EXPECT_EQ(mc::MarkReady(link, 0).code(), StatusCode::kPermissionDenied);
  std::filesystem::remove(link);
  // mkdtemp's directories pass, each with a new name.
  auto a = MakePrivateDir(d.path(), "m-");
  auto b = MakePrivateDir(d.path(), "m-");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString();
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(mc::MarkReady(*a, 0).ok());
}

TEST(MembershipChannelTest, AUsersDirectoryIsCreatedPrivateAndAnotherUsersRefused) {
  TempDir d;
  auto mine = UserPrivateDir(d.path(), "logs");
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_TRUE(CheckPrivateDir(*mine).ok());
  auto again = UserPrivateDir(d.path(), "logs");  // idempotent
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *mine);
  std::filesystem::permissions(*mine, std::filesystem::perms::all);
  EXPECT_EQ(UserPrivateDir(d.path(), "logs").status().code(), StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace cohort::comm
