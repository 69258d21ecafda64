// Agent tests with /bin/sh workers over a MemoryStore (one node).
#include "cohort/agent/agent.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/base/strings.h"
#include "cohort/store/memory_store.h"

namespace cohort::agent {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cohort-agent-test-" + RandomHex(6));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  AgentResult RunShell(const std::string& script, int nproc, int max_restarts) {
    AgentOptions o;
    o.spec.argv = {"/bin/sh", "-c", script};
    o.spec.nproc_per_node = nproc;
    o.spec.max_restarts = max_restarts;
    o.spec.run_id = "job";
    o.spec.log_dir = dir_.string();
    o.spec.local_ranks_filter = {99};  // keep the test output quiet
    o.spec.stop_grace = std::chrono::seconds(2);
    o.spec.extra_env = {{"TEST_DIR", dir_.string()}};
    o.rdzv.run_id = "job";
    o.rdzv.max_restarts = max_restarts;
    o.self.host = "localhost";
    o.self.addr = "127.0.0.1";
    o.self.local_world_size = nproc;
    auto store = std::make_shared<store::MemoryStore>();
    o.connect_store = [store]() -> Result<std::shared_ptr<store::Store>> { return std::shared_ptr<store::Store>(store); };
    Agent agent(std::move(o));
    return agent.Run();
  }
  fs::path dir_;
};

TEST_F(AgentTest, WorkersGetTheTorchrunEnvironmentAndLogsArePerRank) {
  auto r = RunShell(
      "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
      "group=$GROUP_RANK/$GROUP_WORLD_SIZE role=$ROLE_NAME/$ROLE_RANK/$ROLE_WORLD_SIZE "
      "restart=$TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS run=$TORCHELASTIC_RUN_ID "
      "omp=$OMP_NUM_THREADS master=$MASTER_ADDR\"; echo err >&2; "
      "test -n \"$MASTER_PORT\" && test -n \"$TORCHELASTIC_ERROR_FILE\"",
      2, 0);
  ASSERT_EQ(r.exit_code, 0) << r.summary;
  for (int rank = 0; rank < 2; ++rank) {
    fs::path d = dir_ / "job" / "attempt_0" / std::to_string(rank);
    EXPECT_EQ(ReadFile(d / "stdout.log"),
              fmt::format("rank={0} local={0} world=2 lws=2 group=0/1 role=default/{0}/2 "
                          "restart=0/0 run=job omp=1 master=127.0.0.1\n",
                          rank));
    EXPECT_EQ(ReadFile(d / "stderr.log"), "err\n");
  }
}

TEST_F(AgentTest, FailureNamesRankExitCodeAndErrorFileMessage) {
  auto r = RunShell(
      "if [ \"$RANK\" = 1 ]; then "
      "echo '{\"message\": {\"message\": \"ValueError: bad batch\", \"extraInfo\": {}}}' "
      "> \"$TORCHELASTIC_ERROR_FILE\"; exit 3; fi; exec sleep 30",
      2, 0);
  EXPECT_EQ(r.exit_code, kExitWorkerFailed);
  EXPECT_NE(r.summary.find("rank 1"), std::string::npos) << r.summary;
  EXPECT_NE(r.summary.find("exited with code 3"), std::string::npos) << r.summary;
  EXPECT_NE(r.summary.find("ValueError: bad batch"), std::string::npos) << r.summary;
}

TEST_F(AgentTest, KilledWorkerIsReportedWithItsSignal) {
  auto r = RunShell("if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; exec sleep 30", 2, 0);
  EXPECT_EQ(r.exit_code, kExitWorkerFailed);
  EXPECT_NE(r.summary.find("rank 0"), std::string::npos) << r.summary;
  EXPECT_NE(r.summary.find("SIGKILL"), std::string::npos) << r.summary;
}

TEST_F(AgentTest, RestartsWithinBudgetThenSucceeds) {
  auto r = RunShell(
      "echo attempt; if [ \"$TORCHELASTIC_RESTART_COUNT\" -lt 2 ] && [ \"$RANK\" = 1 ]; then "
      "echo failing >&2; exit 1; fi; exit 0",
      2, 2);
  EXPECT_EQ(r.exit_code, 0) << r.summary;
  EXPECT_TRUE(fs::exists(dir_ / "job" / "attempt_0" / "1" / "stderr.log"));
  EXPECT_TRUE(fs::exists(dir_ / "job" / "attempt_2" / "1" / "stdout.log"));
  EXPECT_FALSE(fs::exists(dir_ / "job" / "attempt_3"));
}

TEST_F(AgentTest, BudgetIsSpentThenTheJobFails) {
  auto r = RunShell("echo 'last words' >&2; exit 4", 1, 1);
  EXPECT_EQ(r.exit_code, kExitWorkerFailed);
  EXPECT_NE(r.summary.find("restart budget is spent"), std::string::npos) << r.summary;
  EXPECT_NE(r.summary.find("last words"), std::string::npos) << r.summary;
  EXPECT_TRUE(fs::exists(dir_ / "job" / "attempt_1"));
}

TEST_F(AgentTest, NoDescendantOutlivesTheJob) {
  auto r = RunShell("sleep 300 & echo $! > \"$TEST_DIR/grandchild.$RANK\"; exit 0", 2, 0);
  ASSERT_EQ(r.exit_code, 0) << r.summary;
  for (int rank = 0; rank < 2; ++rank) {
    std::string pid_text = ReadFile(dir_ / ("grandchild." + std::to_string(rank)));
    pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    // The agent SIGKILLed the group; wait (bounded) on a pidfd for the kill to land.
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) continue;  // already gone
    pollfd p{pidfd, POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 5000), 1) << "grandchild " << pid << " still runs";
    ::close(pidfd);
  }
}

TEST_F(AgentTest, MissingProgramIsNotFound) {
  AgentOptions o;
  o.spec.argv = {"/nonexistent/program"};
  o.spec.log_dir = dir_.string();
  o.self.host = "localhost";
  auto store = std::make_shared<store::MemoryStore>();
  o.connect_store = [store]() -> Result<std::shared_ptr<store::Store>> { return std::shared_ptr<store::Store>(store); };
  Agent agent(std::move(o));
  auto r = agent.Run();
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_NE(r.summary.find("/nonexistent/program"), std::string::npos) << r.summary;
}

}  // namespace
}  // namespace cohort::agent
