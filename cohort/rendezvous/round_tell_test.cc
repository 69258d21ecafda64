// RoundTell (round_tell.h): a told end reaches the node it is sent to; a datagram of another
// job, round or key, or a malformed one, is dropped; a wait ends at its deadline or when
// cancelled; peers without a port or an address are skipped. Sockets on 127.0.0.1 (the
// socket is bound to every interface, port 0).
#include "cohort/rendezvous/round_tell.h"

#include <gtest/gtest.h>

#include <thread>

namespace cohort::rendezvous {
namespace {

using namespace std::chrono_literals;

TEST(RoundTellTest, AnEndSentIsTheEndAwaited) {
  auto a = RoundTell::Open();
  auto b = RoundTell::Open();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT((*a)->port(), 0);
  EXPECT_NE((*a)->port(), (*b)->port());
  const std::string end = "carried:1:3:2:8x2\nline two\ndead:node 4 (h) stopped";
  EXPECT_EQ((*a)->Send("job", 7, "k3y", end, {{"127.0.0.1", (*b)->port()}}), 1);
  auto told = (*b)->Await("job", 7, "k3y", Deadline::After(10s));
  ASSERT_TRUE(told.ok()) << told.status().ToString();
  ASSERT_TRUE(told->has_value());
  EXPECT_EQ(**told, end);
}

TEST(RoundTellTest, OtherJobsRoundsAndKeysAreDropped) {
  auto a = RoundTell::Open();
  auto b = RoundTell::Open();
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<RoundTell::Peer> to = {{"127.0.0.1", (*b)->port()}};
  EXPECT_EQ((*a)->Send("other", 7, "k3y", "failure:x", to), 1);
  EXPECT_EQ((*a)->Send("job", 6, "k3y", "failure:x", to), 1);
  EXPECT_EQ((*a)->Send("job", 7, "k3z", "failure:x", to), 1);
  EXPECT_EQ((*a)->Send("job", 7, "", "failure:x", to), 0);  // a round without a key: none
  // The right one after them is taken; the three before are dropped on the way.
  EXPECT_EQ((*a)->Send("job", 7, "k3y", "join:host9", to), 1);
  auto told = (*b)->Await("job", 7, "k3y", Deadline::After(10s));
  ASSERT_TRUE(told.ok() && told->has_value());
  EXPECT_EQ(**told, "join:host9");
  // Nothing else is left for round 7.
  auto none = (*b)->Await("job", 7, "k3y", Deadline::After(100ms));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(RoundTellTest, DatagramsAreParsedStrictly) {
  const std::string good = EncodeToldEnd("job", 12, "key", "done");
  EXPECT_EQ(DecodeToldEnd(good, "job", 12, "key"), std::optional<std::string>("done"));
  EXPECT_EQ(DecodeToldEnd(good, "job", 12, "ke"), std::nullopt);
  EXPECT_EQ(DecodeToldEnd(good, "jo", 12, "key"), std::nullopt);
  EXPECT_EQ(DecodeToldEnd(good, "job", 1, "key"), std::nullopt);
  EXPECT_EQ(DecodeToldEnd("", "job", 12, "key"), std::nullopt);
  EXPECT_EQ(DecodeToldEnd("cohort-end 1\njob\n12\nkey", "job", 12, "key"), std::nullopt);
  EXPECT_EQ(DecodeToldEnd("cohort-end 2\njob\n12\nkey\ndone", "job", 12, "key"), std::nullopt);
  EXPECT_EQ(DecodeToldEnd("cohort-end 1\njob\n12x\nkey\ndone", "job", 12, "key"), std::nullopt);
  EXPECT_EQ(DecodeToldEnd(good, "job", 12, ""), std::nullopt);
}

TEST(RoundTellTest, AWaitEndsAtItsDeadlineOrWhenCancelled) {
  auto a = RoundTell::Open();
  ASSERT_TRUE(a.ok());
  auto none = (*a)->Await("job", 1, "key", Deadline::After(50ms));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  std::thread cancel([&] { (*a)->Cancel(); });
  auto cancelled = (*a)->Await("job", 1, "key", Deadline::After(60s));
  cancel.join();
  EXPECT_EQ(cancelled.status().code(), StatusCode::kCancelled);
  // Cancelled until cleared (a cancel before the wait counts), then waits again.
  EXPECT_EQ((*a)->Await("job", 1, "key", Deadline::After(60s)).status().code(),
            StatusCode::kCancelled);
  (*a)->Uncancel();
  auto again = (*a)->Await("job", 1, "key", Deadline::After(50ms));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
}

TEST(RoundTellTest, PeersWithoutAPortOrAnAddressAreSkipped) {
  auto a = RoundTell::Open();
  auto b = RoundTell::Open();
  ASSERT_TRUE(a.ok() && b.ok());
  const int sent = (*a)->Send("job", 1, "key", "done",
                              {{"127.0.0.1", 0},
                               {"no-such-host.invalid", (*b)->port()},
                               {"127.0.0.1", 70000},
                               {"localhost", (*b)->port()}});
  EXPECT_EQ(sent, 1);
  auto told = (*b)->Await("job", 1, "key", Deadline::After(10s));
  ASSERT_TRUE(told.ok() && told->has_value());
  // An end too long for one datagram is not sent (its nodes learn it at their beats).
  EXPECT_EQ((*a)->Send("job", 1, "key", std::string(RoundTell::kMaxDatagram, 'x'),
                       {{"127.0.0.1", (*b)->port()}}),
            0);
}

}  // namespace
}  // namespace cohort::rendezvous
