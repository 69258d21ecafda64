// ConsoleMerger: merged prefixes, per-rank order, the window, and pass-through when off.
#include "cohort/agent/console_merger.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <string>

namespace cohort::agent {
namespace {

// Captures what a merger writes through a pipe.
class Pipe {
 public:
  Pipe() { EXPECT_EQ(::pipe2(fds_, O_NONBLOCK), 0); }
  ~Pipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  int write_fd() const { return fds_[1]; }
  std::string Read() {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds_[0], buf, sizeof(buf))) > 0) out.append(buf, n);
    return out;
  }

 private:
  int fds_[2];
};

TEST(ConsoleMergerTest, PrefixesNameRankRanges) {
  EXPECT_EQ(ConsoleMerger::Prefix({3}), "[rank3]: ");
  EXPECT_EQ(ConsoleMerger::Prefix({0, 1, 2, 5}), "[ranks 0-2,5]: ");
  EXPECT_EQ(ConsoleMerger::Prefix({1, 3, 4, 7, 8, 9}), "[ranks 1,3-4,7-9]: ");
}

TEST(ConsoleMergerTest, IdenticalLinesOfAllRanksPrintOnceInOrder) {
  Pipe pipe;
  ConsoleMerger m(pipe.write_fd(), 3, std::chrono::hours(1));
  m.Add(0, "loading");
  m.Add(1, "loading");
  m.Add(0, "rank 0 only");
  EXPECT_EQ(pipe.Read(), "");  // "loading" waits for rank 2 (the window is long)
  EXPECT_EQ(m.PollTimeoutMs() > 0, true);
  m.Add(2, "loading");  // complete: out at once, and whatever was waiting behind it stays
  EXPECT_EQ(pipe.Read(), "[ranks 0-2]: loading\n");
  m.FlushAll();
  EXPECT_EQ(pipe.Read(), "[rank0]: rank 0 only\n");
  EXPECT_EQ(m.PollTimeoutMs(), -1);
}

TEST(ConsoleMergerTest, ARanksLinesKeepTheirOrder) {
  Pipe pipe;
  ConsoleMerger m(pipe.write_fd(), 2, std::chrono::hours(1));
  m.Add(0, "a");
  m.Add(0, "b");
  m.Add(1, "b");  // joins rank 0's "b"
  m.Add(1, "a");  // may not join "a" (before "b" for rank 1): a new line
  m.FlushAll();
  EXPECT_EQ(pipe.Read(), "[rank0]: a\n[ranks 0-1]: b\n[rank1]: a\n");
}

TEST(ConsoleMergerTest, TheWindowBoundsTheWaitAndZeroTurnsMergingOff) {
  Pipe pipe;
  ConsoleMerger m(pipe.write_fd(), 2, Duration::zero() + std::chrono::milliseconds(1));
  m.Add(0, "x");
  // Wait for the window through the poll timeout the merger asks for.
  int timeout = m.PollTimeoutMs();
  ASSERT_GE(timeout, 0);
  ::poll(nullptr, 0, timeout + 1);
  m.FlushDue();
  EXPECT_EQ(pipe.Read(), "[rank0]: x\n");
  ConsoleMerger off(pipe.write_fd(), 2, Duration::zero());
  off.Add(0, "y");
  off.Add(1, "y");
  EXPECT_EQ(pipe.Read(), "[rank0]: y\n[rank1]: y\n");
}

}  // namespace
}  // namespace cohort::agent
