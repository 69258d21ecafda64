// Unit tests for Status, Result, strings, settings parsing and Spawn.
#include <fcntl.h>
#include <sys/mman.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cohort/base/backoff.h"
#include "cohort/base/event_fd.h"
#include "cohort/base/file.h"
#include "cohort/base/flight_record.h"
#include "cohort/base/exit_codes.h"
#include "cohort/base/retry_budget.h"
#include "cohort/base/status.h"
#include "cohort/base/strings.h"
#include "cohort/base/settings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/sweeper.h"
#include "cohort/base/temp_dir.h"
#include "cohort/base/time.h"

namespace cohort {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("{} is odd", x);
  return x / 2;
}

Result<int> Quarter(int x) {
  COHORT_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

// Retries past the budget wait for a token: a client sends again at most its saved tokens,
// a share of its first tries and what time adds.
TEST(RetryBudgetTest, RetriesAreAShareOfFirstTriesPlusTime) {
  const SteadyClock::time_point t0 = SteadyClock::now();
  RetryBudget budget({.ratio = 0.2, .per_second = 0.5, .max_tokens = 5}, t0);
  // (Each answer adds one: checked last.)
  for (int i = 0; i < 5; ++i) EXPECT_EQ(budget.Take(t0), Duration::zero()) << i;
  EXPECT_EQ(budget.Take(t0), std::chrono::seconds(2)) << "empty: one token in 2 s";
  EXPECT_EQ(budget.held(), 1);
  for (int i = 0; i < 5; ++i) budget.OnFirstTry(t0);
  EXPECT_EQ(budget.Take(t0), Duration::zero()) << "five first tries add one retry";
  EXPECT_GT(budget.Take(t0), Duration::zero());
  EXPECT_EQ(budget.Take(t0 + std::chrono::seconds(2)), Duration::zero()) << "time adds one";
  // Saved tokens are capped: a long quiet spell buys five retries, not more.
  const auto later = t0 + std::chrono::hours(1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(budget.Take(later), Duration::zero()) << i;
  EXPECT_GT(budget.Take(later), Duration::zero());
  budget.OnAnswer(later);
  EXPECT_EQ(budget.Take(later), Duration::zero()) << "an answer adds one";
  EXPECT_EQ(budget.held(), 3);
}

TEST(LatencyTrackerTest, MovesAnEighthTowardsEachNewAnswer) {
  LatencyTracker t;
  EXPECT_EQ(t.average(), Duration::zero());
  t.Add(std::chrono::milliseconds(800));
  EXPECT_EQ(t.average(), std::chrono::milliseconds(800));
  t.Add(std::chrono::milliseconds(0));
  EXPECT_EQ(t.average(), std::chrono::milliseconds(700));
}

// A status code means one thing per kind of command; a step that fails with it exits so.
TEST(ExitCodeForTest, LauncherAndJobCommandsReadStatusCodesTheirWay) {
  const auto launcher = ExitContext::kLauncher, job = ExitContext::kJobCommand;
  EXPECT_EQ(ExitCodeFor(Status::Ok(), launcher), kExitOk);
  EXPECT_EQ(ExitCodeFor(InvalidArgument("x"), launcher), kExitInvalidValue);
  EXPECT_EQ(ExitCodeFor(InvalidArgument("x"), job), kExitUsage);
  EXPECT_EQ(ExitCodeFor(FailedPrecondition("x"), job), kExitInvalidValue);
  EXPECT_EQ(ExitCodeFor(NotFound("no such file"), launcher), kExitNotFound);
  EXPECT_EQ(ExitCodeFor(NotFound("no such job"), job), kExitNoSuchJob);
  EXPECT_EQ(ExitCodeFor(AlreadyExists("port"), launcher), kExitPortInUse);
  EXPECT_EQ(ExitCodeFor(PermissionDenied("token"), launcher), kExitRendezvous);
  EXPECT_EQ(ExitCodeFor(Unavailable("store"), launcher), kExitRendezvous);
  EXPECT_EQ(ExitCodeFor(Unavailable("kubectl"), job), kExitBackend);
  EXPECT_EQ(ExitCodeFor(Cancelled("by request"), job), kExitJobCancelled);
  // What has no meaning of its own there: the caller's choice, else a bug.
  EXPECT_EQ(ExitCodeFor(Internal("x"), launcher), kExitInternal);
  EXPECT_EQ(ExitCodeFor(DataLoss("x"), job, kExitBackend), kExitBackend);
  EXPECT_EQ(ExitCodeFor(Cancelled("x"), launcher, kExitWorkerFailed), kExitWorkerFailed);
}

TEST(StatusTest, CodesAndMessages) {
  Status s = DeadlineExceeded("waited {} ms", 5);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "DEADLINE_EXCEEDED: waited 5 ms");
  EXPECT_EQ(s.WithContext("get key").message(), "get key: waited 5 ms");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "3 is odd");
}

// What a job leaves in /dev/shm under its cookie, and its private runtime directory, go with
// the sweeper: at once when asked, and by its helper when the agent goes away.
TEST(SweeperTest, SegmentsAndTheRuntimeDirectoryGoWithTheJob) {
  auto segment = [](const std::string& cookie) {
    const std::string name = "/cohort-" + cookie + "-" + RandomHex(8);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    ::close(fd);
    return "/dev/shm" + name;
  };
  auto dir = MakePrivateDir("", "cohort-sweeper-test-");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(ReplaceFile(*dir + "/file", "x").ok());
  std::string left;
  {
    JobSweeper sweeper(*dir);
    const std::string first = segment(sweeper.cookie());
    const std::string other = segment("0123abcd");  // another job's: kept
    EXPECT_EQ(sweeper.RemoveSegments(), 1);
    EXPECT_FALSE(std::filesystem::exists(first));
    EXPECT_TRUE(std::filesystem::exists(other));
    ::unlink(other.c_str());
    left = segment(sweeper.cookie());
  }  // the helper sweeps, then removes the segment and the directory
  EXPECT_FALSE(std::filesystem::exists(left));
  EXPECT_FALSE(std::filesystem::exists(*dir));
}

TEST(StringsTest, SplitTrimHostPort) {
  EXPECT_EQ(Split("a,,b", ','), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Split("a,,b", ',', false), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(Trim("  x "), "x");
  auto hp = ParseHostPort("node0:29500", 1);
  ASSERT_TRUE(hp);
  EXPECT_EQ(hp->first, "node0");
  EXPECT_EQ(hp->second, 29500);
  EXPECT_EQ(ParseHostPort("h", 29400)->second, 29400);
  EXPECT_EQ(ParseHostPort("[::1]:5", 0)->first, "::1");
  EXPECT_FALSE(ParseHostPort("h:99999", 0));
  EXPECT_FALSE(ParseHostPort("h:x", 0));
  EXPECT_EQ(RandomHex(16).size(), 32u);
  EXPECT_NE(RandomHex(16), RandomHex(16));
}

TEST(SettingsTest, ParsesTypedValues) {
  EXPECT_EQ(ParseInt64(" 42 "), 42);
  EXPECT_FALSE(ParseInt64("4x"));
  EXPECT_EQ(ParseBool("Yes"), true);
  EXPECT_FALSE(ParseBool("maybe"));
  ::setenv("COHORT_TEST_SETTING", "17", 1);
  Setting<int> setting("COHORT_TEST_SETTING", 3, "test");
  EXPECT_EQ(setting.Get(), 17);
  Setting<int> missing("COHORT_TEST_SETTING_MISSING", 3, "test");
  EXPECT_EQ(missing.Get(), 3);
}

TEST(DeadlineTest, Expiry) {
  EXPECT_TRUE(Deadline::AfterMs(0).expired());
  EXPECT_FALSE(Deadline::Infinite().expired());
  EXPECT_EQ(Deadline::Infinite().PollTimeoutMs(), -1);
  EXPECT_GT(Deadline::AfterMs(1000).PollTimeoutMs(), 900);
}

// The descriptor given with pass_fd is the child's 3, and it is the only one it gets
// (the cohort warm interpreter's channel travels this way).
TEST(SpawnTest, PassedDescriptorIsThreeAndNothingElseLeaks) {
  int channel[2], leak[2];
  ASSERT_EQ(::pipe2(channel, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe(leak), 0);  // not close-on-exec: Spawn must still not pass it
  SpawnOptions so;
  so.argv = {"/bin/sh", "-c",
             "echo on3 >&3; ls /proc/self/fd | sort -n | tr '\\n' ' ' >&3"};
  so.pass_fd = channel[1];
  so.capture_output = false;
  auto child = Spawn(so);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  ::close(channel[1]);
  ExitStatus st = Reap(child->pid);
  ::close(child->pidfd);
  EXPECT_TRUE(st.success()) << st.Describe();
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::read(channel[0], buf, sizeof buf)) > 0;) got.append(buf, n);
  ::close(channel[0]);
  ::close(leak[0]);
  ::close(leak[1]);
  // 0-2, the channel on 3, and the directory ls reads (the lowest free number, 4).
  EXPECT_EQ(got.substr(0, 4), "on3\n");
  EXPECT_EQ(Trim(got.substr(4)), "0 1 2 3 4") << "leaked pipe: " << leak[0] << "," << leak[1];
}

// RunAndCapture: input in, both streams out, the exit status; a command that ignores its
// input or outlives its deadline ends cleanly (no SIGPIPE here, nothing left running).
TEST(RunAndCaptureTest, InputOutputStatusAndDeadline) {
  auto r = RunAndCapture({"/bin/sh", "-c", "tr a-z A-Z; echo err >&2; exit 3"}, {},
                         "hello\n", Deadline::AfterMs(10000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->out, "HELLO\n");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_TRUE(r->status.exited);
  EXPECT_EQ(r->status.code, 3);
  // A large input the command never reads: EPIPE, not a dead test.
  auto ignored = RunAndCapture({"/bin/true"}, {}, std::string(1 << 20, 'x'),
                               Deadline::AfterMs(10000));
  ASSERT_TRUE(ignored.ok()) << ignored.status().ToString();
  EXPECT_TRUE(ignored->status.success());
  // The environment given is the whole environment.
  auto env = RunAndCapture({"/usr/bin/env"}, {"ONLY=this"}, "", Deadline::AfterMs(10000));
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->out, "ONLY=this\n");
  auto slow = RunAndCapture({"/bin/sh", "-c", "sleep 30 & sleep 30"}, {}, "",
                            Deadline::AfterMs(200));
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), StatusCode::kDeadlineExceeded);
  auto missing = RunAndCapture({"no-such-program-here"}, {}, "", Deadline::AfterMs(1000));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
}

// The flight record comm writes is the one the agent reads: the newest operation of the
// newest dump in a file that holds several.
TEST(FlightRecordTest, WrittenAndReadInOneFormat) {
  FlightRecordEntry a{.seq = 7, .op = "allreduce", .dtype = "float32", .redop = "sum",
                      .count = 1024, .root = -1, .state = "completed", .start = 1.5, .ms = 2.0,
                      .error = ""};
  FlightRecordEntry b = a;
  b.seq = 8;
  b.op = "broadcast";
  b.state = "failed";
  b.error = "peer 1 closed the connection";
  std::string file = FormatFlightRecord(3, {a}) + FormatFlightRecord(3, {a, b});
  auto last = LastFlightRecordEntry(file);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->seq, 8u);
  EXPECT_EQ(last->op, "broadcast");
  EXPECT_EQ(last->count, 1024u);
  EXPECT_EQ(last->state, "failed");
  EXPECT_EQ(last->error, "peer 1 closed the connection");
  EXPECT_FALSE(LastFlightRecordEntry(FormatFlightRecord(0, {})).has_value());
  EXPECT_EQ(FlightRecordPath("/d", 4), "/d/rank4.txt");
}

TEST(FileAndEventTest, ReadFileToStringAndEventFd) {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string("a\0b", 3);
  }
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, std::string("a\0b", 3));
  auto missing = ReadFileToString(dir.path() + "/none");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);
  EventFd ev;
  EXPECT_FALSE(ev.Readable());
  ev.Notify();
  ev.Notify();
  EXPECT_TRUE(ev.Readable());
  ev.Drain();
  EXPECT_FALSE(ev.Readable());
}

TEST(BackoffTest, DoublesToTheMaximumAndStopsAtTheDeadline) {
  using std::chrono::milliseconds;
  Backoff b(milliseconds(10), milliseconds(35));
  EXPECT_EQ(b.Next(), milliseconds(10));
  EXPECT_EQ(b.Next(), milliseconds(20));
  EXPECT_EQ(b.Next(), milliseconds(35));
  EXPECT_EQ(b.Next(), milliseconds(35));
  b.Reset();
  EXPECT_EQ(b.Next(), milliseconds(10));

  // Never past the deadline: the pause is cut to what is left, and Sleep says when to stop.
  Backoff near(std::chrono::hours(1), std::chrono::hours(1), Deadline::AfterMs(20));
  EXPECT_LE(near.Next(), milliseconds(20));
  Backoff over(milliseconds(1), milliseconds(1), Deadline::AfterMs(0));
  EXPECT_EQ(over.Next(), Duration::zero());
  EXPECT_FALSE(over.Sleep());
}

}  // namespace
}  // namespace cohort
