// The agent's side of live reconfiguration without root or a second node: a WorkerGroup of
// /bin/sh workers, the test playing the workers' part of the membership channel.
#include "cohort/agent/live_reconfig.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>

#include <filesystem>

#include "cohort/base/strings.h"

namespace cohort::agent {
namespace {

namespace fs = std::filesystem;
using rendezvous::RendezvousInfo;
using rendezvous::RoundEnd;

class LiveReconfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cohort-live-test-" + RandomHex(6));
    fs::create_directories(dir_);
    o_.spec.argv = {"/bin/sh", "-c", "exec sleep 600"};
    o_.spec.nproc_per_node = 2;
    o_.spec.run_id = "job";
    o_.spec.log_dir = dir_.string();
    o_.spec.local_ranks_filter = {99};
    o_.spec.stop_grace = std::chrono::seconds(2);
    o_.self.host = "localhost";
  }
  void TearDown() override {
    group_.Stop(SIGKILL);
    live_.reset();
    fs::remove_all(dir_);
  }

  // A live reconfiguration offered to a running group of two workers, in round 1 of a
  // job of two nodes (this one second).
  void StartGroup(int min_nodes, Duration reform_timeout) {
    live_ = std::make_unique<LiveReconfig>(true, min_nodes, reform_timeout);
    ASSERT_FALSE(live_->MakeRuntimeDir().empty());
    group_.Prepare(live_->MakeRuntimeDir());
    live_->OpenChannel();
    ASSERT_TRUE(live_->open());
    info_ = RendezvousInfo{.round = 1, .group_rank = 1, .group_world_size = 2,
                           .rank_offset = 2, .world_size = 4};
    ASSERT_TRUE(group_.Start({.info = info_, .master = {"127.0.0.1", 1234},
                              .membership_dir = live_->dir(),
                              .membership_secret = live_->secret()})
                    .ok());
  }
  void MarkAllReady() {
    for (int local = 0; local < 2; ++local) {
      ASSERT_TRUE(membership_channel::MarkReady(live_->dir(), local).ok());
    }
  }
  // Waits (bounded) for the channel's fd, then reads it.
  std::optional<LostPeerReport> ReadWhenChanged(int64_t round, double* formed_ms) {
    pollfd p{live_->fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 5000), 1);
    return live_->Read(round, group_, [&](double ms) { *formed_ms = ms; });
  }

  fs::path dir_;
  AgentOptions o_;
  WorkerGroup group_{o_, [] {}, {}};
  std::unique_ptr<LiveReconfig> live_;
  RendezvousInfo info_;
};

TEST_F(LiveReconfigTest, KeepsReadyWorkersThroughAJoinOrADeadNodeWhileEnoughNodesRemain) {
  StartGroup(/*min_nodes=*/1, std::chrono::seconds(30));
  const RoundEnd join{RoundEnd::Kind::kJoin, ""}, dead{RoundEnd::Kind::kDeadNode, ""};
  EXPECT_FALSE(live_->Keeps(join, info_, group_)) << "workers not ready yet";
  MarkAllReady();
  EXPECT_TRUE(live_->Keeps(join, info_, group_));
  EXPECT_TRUE(live_->Keeps(dead, info_, group_));
  EXPECT_FALSE(live_->Keeps(RoundEnd{RoundEnd::Kind::kFailure, "rank 0"}, info_, group_));
  // Below MIN nodes after the loss: the job waits for nodes without workers.
  LiveReconfig strict(true, /*min_nodes=*/2, std::chrono::seconds(30));
  EXPECT_FALSE(strict.Keeps(dead, info_, group_)) << "no channel of its own";
  // A worker that exited is not kept.
  kill(group_.workers()[1].child.pid, SIGKILL);
  pollfd p{group_.workers()[1].child.pidfd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  EXPECT_FALSE(group_.ReapExited());
  EXPECT_FALSE(live_->Keeps(join, info_, group_));
}

TEST_F(LiveReconfigTest, AnnounceTellsEachWorkerItsNewRankAndStartsTheDeadline) {
  StartGroup(1, std::chrono::seconds(30));
  MarkAllReady();
  EXPECT_EQ(live_->ReformTimeoutMs(), -1);
  RendezvousInfo next{.round = 2, .group_rank = 0, .group_world_size = 1, .rank_offset = 0,
                      .world_size = 2, .restart_count = 1, .store_prefix = "rdzv/job/r2/w"};
  ASSERT_TRUE(live_->Announce(next, {"10.0.0.1", 4321}, group_).ok());
  EXPECT_EQ(live_->reforms(), 1);
  EXPECT_GT(live_->ReformTimeoutMs(), 0);
  for (int local = 0; local < 2; ++local) {
    EXPECT_EQ(group_.workers()[local].rank, local);
    auto notice = membership_channel::ReadNotice(live_->dir(), local, live_->secret());
    ASSERT_TRUE(notice.ok()) << notice.status().message();
    EXPECT_EQ(notice->round, 2);
    EXPECT_EQ(notice->rank, local);
    EXPECT_EQ(notice->world_size, 2);
    EXPECT_EQ(notice->group_world_size, 1);
    EXPECT_EQ(notice->store_prefix, "rdzv/job/r2/w");
    EXPECT_EQ(notice->master_addr, "10.0.0.1");
    EXPECT_EQ(notice->master_port, 4321);
    // A notice read with another secret is refused.
    EXPECT_FALSE(membership_channel::ReadNotice(live_->dir(), local, "wrong").ok());
  }
  // Both re-formed: the deadline is off and the time is reported once.
  double formed_ms = -1;
  ASSERT_TRUE(membership_channel::WriteFormed(live_->dir(), 0, 2).ok());
  EXPECT_FALSE(ReadWhenChanged(2, &formed_ms));
  EXPECT_EQ(formed_ms, -1) << "only one of two formed";
  ASSERT_TRUE(membership_channel::WriteFormed(live_->dir(), 1, 2).ok());
  EXPECT_FALSE(ReadWhenChanged(2, &formed_ms));
  EXPECT_GE(formed_ms, 0);
  EXPECT_EQ(live_->ReformTimeoutMs(), -1);
  EXPECT_FALSE(live_->ReformTimedOut());
}

TEST_F(LiveReconfigTest, ALostPeerReportEndsOnlyItsOwnRound) {
  StartGroup(1, std::chrono::seconds(30));
  double formed_ms = -1;
  // From a worker that had not seen round 1 yet: ignored.
  ASSERT_TRUE(membership_channel::WriteLost(live_->dir(), 0, {.round = 0, .rank = 2, .reason = "old"},
                                            live_->secret())
                  .ok());
  EXPECT_FALSE(ReadWhenChanged(1, &formed_ms));
  ASSERT_TRUE(membership_channel::WriteLost(live_->dir(), 1,
                                            {.round = 1, .rank = 3, .reason = "peer 0 closed"},
                                            live_->secret())
                  .ok());
  auto lost = ReadWhenChanged(1, &formed_ms);
  ASSERT_TRUE(lost);
  EXPECT_EQ(lost->rank, 3);
  EXPECT_EQ(lost->reason, "peer 0 closed");
}

TEST_F(LiveReconfigTest, WorkersThatDoNotReformInTimeTimeOut) {
  StartGroup(1, std::chrono::milliseconds(50));
  MarkAllReady();
  ASSERT_TRUE(live_->Announce({.round = 2, .world_size = 2}, {"127.0.0.1", 1}, group_).ok());
  EXPECT_FALSE(live_->ReformTimedOut());
  // No worker says it formed: the polls end at the deadline (a poll's timeout is whole ms;
  // the ready marks are read as they come, and change nothing).
  double formed_ms = -1;
  for (int polls = 0; !live_->ReformTimedOut(); ++polls) {
    ASSERT_LT(polls, 100);
    pollfd p{live_->fd(), POLLIN, 0};
    if (::poll(&p, 1, live_->ReformTimeoutMs() + 1) > 0) {
      EXPECT_FALSE(live_->Read(2, group_, [&](double ms) { formed_ms = ms; }));
    }
  }
  EXPECT_EQ(formed_ms, -1);
  // Closing the channel (the group is stopped) drops the deadline and the directory.
  const std::string dir = live_->dir();
  live_->CloseChannel();
  EXPECT_FALSE(live_->ReformTimedOut());
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(LiveReconfigTest, NotOfferedMeansNoChannel) {
  LiveReconfig off(false, 1, std::chrono::seconds(1));
  EXPECT_TRUE(off.MakeRuntimeDir().empty());
  off.OpenChannel();
  EXPECT_FALSE(off.open());
  EXPECT_EQ(off.fd(), -1);
  EXPECT_TRUE(off.dir().empty());
}

}  // namespace
}  // namespace cohort::agent
