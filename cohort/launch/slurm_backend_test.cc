// Unit tests of the slurm backend without Slurm: the sbatch script (its #SBATCH lines, the
// srun line, shell quoting; the script is also run with stand-in srun/scontrol/cohort
// programs to check what the agents would receive), the parsing of `scontrol show job -o`
// and `sinfo` output captured from a real Slurm 22.05, the state mapping and the fallback
// to the files a job leaves. The real cluster is exercised by tests/slurm/.
#include "cohort/launch/slurm_backend.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cohort/base/strings.h"
#include "cohort/base/temp_dir.h"

namespace cohort::launch {
namespace {

namespace fs = std::filesystem;
using slurm::Record;


JobSpec BaseSpec() {
  JobSpec spec;
  spec.name = "fmnist";
  spec.entrypoint = "python3";
  spec.args = {"train.py", "--epochs", "3"};
  return spec;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::vector<std::string> SbatchLines(const std::string& script) {
  std::vector<std::string> out;
  for (const auto& line : Split(script, '\n')) {
    if (StartsWith(line, "#SBATCH ")) out.push_back(line.substr(8));
  }
  return out;
}

// --- rendering ---------------------------------------------------------------------------

TEST(RenderSbatch, SingleNodeJob) {
  JobSpec spec = BaseSpec();
  spec.nproc_per_node = 2;
  spec.max_restarts = 3;
  spec.resources.cpu = 3.5;
  spec.resources.memory_bytes = int64_t{8} << 30;
  spec.resources.memory_text = "8Gi";
  spec.resources.gpu = 2;
  spec.queue = "gpu";
  spec.priority = "10";
  auto script = RenderSbatch(spec, {}, "/opt/cohort/bin/cohort", "/home/u/.cohort/logs/7");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  EXPECT_TRUE(StartsWith(*script, "#!/bin/bash\n"));
  EXPECT_EQ(SbatchLines(*script),
            (std::vector<std::string>{"--job-name=fmnist", "--nodes=1", "--ntasks-per-node=1",
                                      "--cpus-per-task=4", "--mem=8192M", "--gres=gpu:2",
                                      "--partition=gpu", "--nice=10",
                                      "--output=/home/u/.cohort/logs/7/slurm-%j.out",
                                      "--error=/home/u/.cohort/logs/7/slurm-%j.out"}));
  EXPECT_TRUE(Contains(*script,
                       "srun --nodes=\"$SLURM_JOB_NUM_NODES\" "
                       "--ntasks=\"$SLURM_JOB_NUM_NODES\" --ntasks-per-node=1 "
                       "--cpus-per-task=4 --kill-on-bad-exit=0"))
      << *script;
  EXPECT_TRUE(Contains(*script,
                       "/opt/cohort/bin/cohort run --nnodes 1 --nproc-per-node 2 "
                       "--max-restarts 3 \\\n  --rdzv-id \"$SLURM_JOB_ID\" "
                       "--log-dir \"$log_dir/$unit/ranks\" \\\n  -- python3 \"$@\"\n"))
      << *script;
  EXPECT_TRUE(Contains(*script, "set -- train.py --epochs 3  # the program's arguments\n"))
      << *script;
  // One node: cohort run serves its own store; no token, no endpoint, no array.
  EXPECT_FALSE(Contains(*script, "COHORT_TOKEN")) << *script;
  EXPECT_FALSE(Contains(*script, "--rdzv-endpoint")) << *script;
  EXPECT_FALSE(Contains(*script, "SLURM_ARRAY_TASK_ID")) << *script;
  EXPECT_TRUE(Contains(*script,
                       "printf '%s\\n' \"$rc\" > \"$log_dir/slurm-$tag.exit\"\n"
                       "exit \"$rc\"\n"))
      << *script;
}

TEST(RenderSbatch, MultiNodeElasticUsesTheFirstNodesStore) {
  JobSpec spec = BaseSpec();
  spec.min_nodes = 2;
  spec.max_nodes = 4;
  spec.rdzv.port = 29555;
  auto script = RenderSbatch(spec, {}, "cohort", "/logs/3");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  auto lines = SbatchLines(*script);
  EXPECT_EQ(lines[1], "--nodes=2-4");
  EXPECT_TRUE(Contains(*script,
                       "COHORT_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | "
                       "tr -d ' \\n')\nexport COHORT_TOKEN\n"))
      << *script;
  EXPECT_TRUE(Contains(*script,
                       "first_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" "
                       "| head -n 1)"))
      << *script;
  EXPECT_TRUE(Contains(*script,
                       "export PET_RDZV_CONF=\"is_host=$h\"; exec \"$@\"' "
                       "cohort-agent"))
      << *script;
  EXPECT_TRUE(Contains(*script,
                       "cohort run --nnodes 2:4 --nproc-per-node 1 --max-restarts 0 "
                       "\\\n  --rdzv-backend c10d --rdzv-endpoint "
                       "\"$rdzv_host\":29555 \\\n  --rdzv-id \"$SLURM_JOB_ID\""))
      << *script;
}

TEST(RenderSbatch, EtcdRendezvous) {
  JobSpec spec = BaseSpec();
  spec.min_nodes = spec.max_nodes = 3;
  spec.rdzv.backend = "etcd";
  spec.rdzv.endpoint = "etcd1:2379,etcd2:2379";
  auto script = RenderSbatch(spec, {}, "cohort", "/logs/4");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  EXPECT_EQ(SbatchLines(*script)[1], "--nodes=3");
  EXPECT_TRUE(Contains(*script, "--rdzv-backend etcd --rdzv-endpoint etcd1:2379,etcd2:2379"))
      << *script;
  // etcd needs neither the store's token nor the first node's address.
  EXPECT_FALSE(Contains(*script, "COHORT_TOKEN")) << *script;
  EXPECT_FALSE(Contains(*script, "first_node")) << *script;
  EXPECT_FALSE(Contains(*script, "is_host")) << *script;
}

TEST(RenderSbatch, ExplicitC10dEndpointIsPassedThrough) {
  JobSpec spec = BaseSpec();
  spec.min_nodes = spec.max_nodes = 2;
  spec.rdzv.endpoint = "store.example:29400";
  auto script = RenderSbatch(spec, {}, "cohort", "/logs/4");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  EXPECT_TRUE(Contains(*script, "--rdzv-backend c10d --rdzv-endpoint store.example:29400"));
  EXPECT_TRUE(Contains(*script, "export COHORT_TOKEN"));
  EXPECT_FALSE(Contains(*script, "first_node"));
}

TEST(RenderSbatch, ArrayWithConcurrencyAndPerElementEnvironment) {
  JobSpec spec = BaseSpec();
  spec.array.range = "0-2";
  spec.array.concurrency = 2;
  spec.env = {{"SHARED", "yes"}};
  std::vector<ArrayElement> elements;
  for (int i = 0; i < 3; ++i) {
    elements.push_back({i,
                        {{"COHORT_ARRAY_INDEX", std::to_string(i)},
                         {"COHORT_ARRAY_SIZE", "3"},
                         {"LR", i == 1 ? "it's 0.1" : "0.2"}}});
  }
  auto script = RenderSbatch(spec, elements, "cohort", "/logs/5");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  auto lines = SbatchLines(*script);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "--array=0-2%2"), lines.end()) << *script;
  EXPECT_NE(std::find(lines.begin(), lines.end(), "--output=/logs/5/slurm-%A_%a.out"), lines.end())
      << *script;
  EXPECT_TRUE(Contains(*script,
                       "case \"${SLURM_ARRAY_TASK_ID:-}\" in\n  0)\n"
                       "    export COHORT_ARRAY_INDEX=0\n"
                       "    export COHORT_ARRAY_SIZE=3\n"
                       "    export LR=0.2\n"
                       "    set -- train.py --epochs 3\n    ;;\n"))
      << *script;
  EXPECT_TRUE(Contains(*script, "    export LR='it'\\''s 0.1'\n")) << *script;
  EXPECT_TRUE(Contains(*script, "export SHARED=yes\n")) << *script;
  EXPECT_TRUE(Contains(*script, "tag=\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\""));
  // Without a limit there is no %.
  spec.array.concurrency = 0;
  script = RenderSbatch(spec, elements, "cohort", "/logs/5");
  ASSERT_TRUE(script.ok());
  lines = SbatchLines(*script);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "--array=0-2"), lines.end()) << *script;
}

TEST(RenderSbatch, OddStringsAreQuoted) {
  JobSpec spec = BaseSpec();
  spec.entrypoint = "/opt/my tools/run";
  spec.args = {"it's \"quoted\" $HOME", "`date`", "a;b", ""};
  spec.env = {{"MSG", "it's \"quoted\" $HOME"}};
  auto script = RenderSbatch(spec, {}, "/opt/co hort/cohort", "/logs/with space/%x/9");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  EXPECT_TRUE(Contains(*script, "-- '/opt/my tools/run' \"$@\"\n")) << *script;
  EXPECT_TRUE(Contains(*script, "set -- 'it'\\''s \"quoted\" $HOME' '`date`' 'a;b' ''  #"))
      << *script;
  EXPECT_TRUE(Contains(*script, "export MSG='it'\\''s \"quoted\" $HOME'\n")) << *script;
  EXPECT_TRUE(Contains(*script, "'/opt/co hort/cohort' run")) << *script;
  // sbatch takes a blank only inside double quotes; % is doubled so Slurm keeps it.
  EXPECT_TRUE(Contains(*script, "#SBATCH --output=\"/logs/with space/%%x/9/slurm-%j.out\"\n"))
      << *script;
  EXPECT_TRUE(Contains(*script, "log_dir='/logs/with space/%x/9'\n")) << *script;
}

TEST(RenderSbatch, RefusesWhatAScriptCannotCarry) {
  JobSpec spec = BaseSpec();
  spec.priority = "high";
  auto r = RenderSbatch(spec, {}, "cohort", "/logs/1");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "priority")) << r.status().message();

  spec = BaseSpec();
  spec.env = {{"BAD-NAME", "x"}};
  r = RenderSbatch(spec, {}, "cohort", "/logs/1");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "env.BAD-NAME")) << r.status().message();

  spec = BaseSpec();
  r = RenderSbatch(spec, {}, "cohort", "/logs/\"x\"");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "#SBATCH")) << r.status().message();
}

// Runs a rendered script with stand-ins for srun (runs its command as node 0 and node 1),
// scontrol (answers the two questions the script asks) and cohort (records its argv and
// the variables the agents read). Checks what the agents would really receive.
class RenderedScriptRun : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v bash >/dev/null 2>&1") != 0) GTEST_SKIP() << "no bash";
    bin_ = dir_.path() + "/bin";
    dir_.File("bin/srun",
              "#!/bin/bash\n"
              "while [ \"${1#--}\" != \"$1\" ]; do shift; done\n"
              "for node in 0 1; do SLURM_NODEID=$node \"$@\" || exit $?; done\n",
              true);
    dir_.File("bin/scontrol",
              "#!/bin/bash\n"
              "case \"$1 $2\" in\n"
              "  'show hostnames') printf 'n1\\nn2\\n' ;;\n"
              "  'show node') echo \"NodeName=$4 Arch=x86_64 NodeAddr=10.0.0.1 "
              "NodeHostName=h1 Port=0\" ;;\n"
              "  *) exit 1 ;;\n"
              "esac\n",
              true);
    cohort_ = dir_.File("bin/fake cohort",
                        "#!/bin/bash\n"
                        "out=\"$FAKE_OUT/node$SLURM_NODEID\"\n"
                        ": > \"$out\"\n"
                        "for a in \"$@\"; do printf '[%s]\\n' \"$a\" >> \"$out\"; done\n"
                        "printf 'PET_RDZV_CONF=%s\\n' \"${PET_RDZV_CONF:-}\" >> \"$out\"\n"
                        "printf 'TOKEN=%s\\n' \"${COHORT_TOKEN:-}\" >> \"$out\"\n"
                        "printf 'MSG=%s\\n' \"${MSG:-}\" >> \"$out\"\n"
                        "exit ${FAKE_EXIT:-0}\n",
                        true);
  }

  // Runs `script` like slurmstepd would (job id 42 on n[1-2]); returns its exit status.
  int Run(const std::string& script, const std::string& extra_env = "") {
    std::string path = dir_.File("job.sbatch", script);
    std::string cmd = fmt::format(
        "cd {} && env PATH={}:/usr/bin:/bin SLURM_JOB_ID=42 SLURM_JOB_NUM_NODES=2 "
        "SLURM_JOB_NODELIST='n[1-2]' FAKE_OUT={} {} bash {} > {}/script.out 2>&1",
        ShellQuote(dir_.path()), ShellQuote(bin_), ShellQuote(dir_.path()), extra_env,
        ShellQuote(path), ShellQuote(dir_.path()));
    int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  TempDir dir_;
  std::string bin_;
  std::string cohort_;
};

TEST_F(RenderedScriptRun, AgentsReceiveExactArgumentsAndOneHost) {
  JobSpec spec = BaseSpec();
  spec.min_nodes = spec.max_nodes = 2;
  spec.entrypoint = "/bin/echo";
  spec.args = {"it's \"quoted\" $HOME", "two words", ""};
  spec.env = {{"MSG", "it's \"quoted\" $HOME"}};
  spec.rdzv.port = 29611;
  const std::string logs = dir_.path() + "/logs dir";
  fs::create_directories(logs);  // Slurm opens the output file there before the script runs
  auto script = RenderSbatch(spec, {}, cohort_, logs);
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  ASSERT_EQ(Run(*script), 0) << dir_.Read("script.out") << *script;

  const std::string node0 = dir_.Read("node0"), node1 = dir_.Read("node1");
  const std::string args =
      "[run]\n[--nnodes]\n[2]\n[--nproc-per-node]\n[1]\n[--max-restarts]\n[0]\n"
      "[--rdzv-backend]\n[c10d]\n[--rdzv-endpoint]\n[10.0.0.1:29611]\n[--rdzv-id]\n[42]\n"
      "[--log-dir]\n[" +
      logs +
      "/job/ranks]\n[--]\n[/bin/echo]\n"
      "[it's \"quoted\" $HOME]\n[two words]\n[]\n";
  EXPECT_TRUE(StartsWith(node0, args)) << node0;
  EXPECT_TRUE(StartsWith(node1, args)) << node1;
  EXPECT_TRUE(Contains(node0, "PET_RDZV_CONF=is_host=1\n")) << node0;
  EXPECT_TRUE(Contains(node1, "PET_RDZV_CONF=is_host=0\n")) << node1;
  EXPECT_TRUE(Contains(node0, "MSG=it's \"quoted\" $HOME\n")) << node0;
  // The same fresh secret on both nodes.
  auto token = [](const std::string& text) {
    size_t at = text.find("TOKEN=");
    return text.substr(at + 6, text.find('\n', at) - at - 6);
  };
  EXPECT_EQ(token(node0).size(), 32u) << node0;
  EXPECT_EQ(token(node0), token(node1));
  EXPECT_EQ(dir_.Read("logs dir/slurm-42.exit"), "0\n");
}

TEST_F(RenderedScriptRun, ExitCodeIsRecordedAndReturned) {
  JobSpec spec = BaseSpec();
  auto script = RenderSbatch(spec, {}, cohort_, dir_.path());
  ASSERT_TRUE(script.ok());
  EXPECT_EQ(Run(*script, "FAKE_EXIT=7"), 7) << dir_.Read("script.out");
  EXPECT_EQ(dir_.Read("slurm-42.exit"), "7\n");
}

TEST_F(RenderedScriptRun, ArrayElementGetsItsEnvironment) {
  JobSpec spec = BaseSpec();
  std::vector<ArrayElement> elements = {{0, {{"MSG", "zero"}}}, {1, {{"MSG", "o'ne $x"}}}};
  auto script = RenderSbatch(spec, elements, cohort_, dir_.path());
  ASSERT_TRUE(script.ok());
  ASSERT_EQ(Run(*script, "SLURM_ARRAY_JOB_ID=40 SLURM_ARRAY_TASK_ID=1"), 0)
      << dir_.Read("script.out");
  EXPECT_TRUE(Contains(dir_.Read("node0"), "MSG=o'ne $x\n")) << dir_.Read("node0");
  EXPECT_TRUE(Contains(dir_.Read("node0"), "[" + dir_.path() + "/1/ranks]\n"));
  EXPECT_EQ(dir_.Read("slurm-40_1.exit"), "0\n");
  // An index the script does not know is an error, not a run without environment.
  EXPECT_EQ(Run(*script, "SLURM_ARRAY_JOB_ID=40 SLURM_ARRAY_TASK_ID=5"), 2);
  EXPECT_TRUE(Contains(dir_.Read("script.out"), "no array element '5'"));
}

// --- scontrol / sinfo parsing ----------------------------------------------------------

// Captured from Slurm 22.05 (tests/slurm's fake cluster): a finished 3-node job, then an
// array 0-3%2 whose element 2 failed, while it ran and after it ended.
const char* kFailedJob =
    "JobId=1 JobName=t1 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 "
    "RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T14:56:01 "
    "EligibleTime=2026-11-29T14:56:01 AccrueTime=2026-11-29T14:56:01 "
    "StartTime=2026-11-29T14:56:02 EndTime=2026-11-29T14:56:02 Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-29T14:56:02 Scheduler=Main Partition=debug "
    "AllocNode:Sid=localhost:6973 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-3] "
    "BatchHost=n1 NumNodes=3 NumCPUs=3 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=3,node=3,billing=3 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/sl/a.sh "
    "WorkDir=/tmp/sl StdErr=/tmp/sl/with space/out-1.log StdIn=/dev/null "
    "StdOut=/tmp/sl/with space/out-1.log Power= \n";

TEST(ParseScontrol, FieldsOfOneRecord) {
  auto records = slurm::ParseScontrolRecords(kFailedJob);
  ASSERT_EQ(records.size(), 1u);
  const Record& r = records[0];
  EXPECT_EQ(r.at("JobId"), "1");
  EXPECT_EQ(r.at("JobState"), "FAILED");
  EXPECT_EQ(r.at("ExitCode"), "3:0");
  EXPECT_EQ(r.at("TRES"), "cpu=3,node=3,billing=3");
  EXPECT_EQ(r.at("NtasksPerN:B:S:C"), "1:0:*:*");
  EXPECT_EQ(r.at("StdOut"), "/tmp/sl/with space/out-1.log");  // a value with a blank
  EXPECT_EQ(r.at("Power"), "");
  JobStatus s = slurm::StatusFromRecords(records, 0);
  EXPECT_EQ(s.state, "failed");
  EXPECT_EQ(s.exit_code, 3);
  EXPECT_TRUE(Contains(s.detail, "FAILED (NonZeroExitCode), exit code 3")) << s.detail;
}

// Trimmed to the fields the backend reads (the real lines carry all of kFailedJob's).
const char* kArrayRunning =
    "JobId=2 ArrayJobId=2 ArrayTaskId=2-3%2 ArrayTaskThrottle=2 JobName=arr "
    "JobState=PENDING Reason=JobArrayTaskLimit ExitCode=0:0 StartTime=Unknown "
    "EndTime=Unknown NodeList=(null) StdOut=/tmp/sl/arr-2_4294967294.log\n"
    "JobId=4 ArrayJobId=2 ArrayTaskId=1 ArrayTaskThrottle=2 JobName=arr JobState=RUNNING "
    "Reason=None ExitCode=0:0 StartTime=2026-11-29T14:56:09 EndTime=Unknown NodeList=n1 "
    "StdOut=/tmp/sl/arr-2_1.log\n"
    "JobId=3 ArrayJobId=2 ArrayTaskId=0 ArrayTaskThrottle=2 JobName=arr "
    "JobState=COMPLETED Reason=None ExitCode=0:0 StartTime=2026-11-29T14:56:09 "
    "EndTime=2026-11-29T14:56:11 NodeList=n1 StdOut=/tmp/sl/arr-2_0.log\n";

const char* kArrayDone =
    "JobId=2 ArrayJobId=2 ArrayTaskId=3 JobState=COMPLETED Reason=None ExitCode=0:0 "
    "StartTime=2026-11-29T14:56:15 EndTime=2026-11-29T14:56:17\n"
    "JobId=5 ArrayJobId=2 ArrayTaskId=2 JobState=FAILED Reason=NonZeroExitCode "
    "ExitCode=7:0 StartTime=2026-11-29T14:56:12 EndTime=2026-11-29T14:56:14\n"
    "JobId=4 ArrayJobId=2 ArrayTaskId=1 JobState=COMPLETED Reason=None ExitCode=0:0 "
    "StartTime=2026-11-29T14:56:09 EndTime=2026-11-29T14:56:11\n"
    "JobId=3 ArrayJobId=2 ArrayTaskId=0 JobState=COMPLETED Reason=None ExitCode=0:0 "
    "StartTime=2026-11-29T14:56:09 EndTime=2026-11-29T14:56:11\n";

TEST(ParseScontrol, ArrayWhileRunning) {
  JobStatus s = slurm::StatusFromRecords(slurm::ParseScontrolRecords(kArrayRunning), 4);
  ASSERT_EQ(s.elements.size(), 4u);
  EXPECT_EQ(s.elements[0].state, "succeeded");
  EXPECT_EQ(s.elements[0].exit_code, 0);
  EXPECT_GT(s.elements[0].ended_at, s.elements[0].started_at - 1);
  EXPECT_GT(s.elements[0].started_at, 0);
  EXPECT_EQ(s.elements[1].state, "running");
  EXPECT_FALSE(s.elements[1].exit_code.has_value());
  EXPECT_EQ(s.elements[1].ended_at, 0);
  EXPECT_EQ(s.elements[2].state, "pending");
  EXPECT_EQ(s.elements[3].state, "pending");
  EXPECT_TRUE(Contains(s.elements[3].detail, "JobArrayTaskLimit")) << s.elements[3].detail;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.elements[static_cast<size_t>(i)].index, i);
  EXPECT_EQ(s.state, "running");
  EXPECT_FALSE(s.exit_code.has_value());
}

TEST(ParseScontrol, ArrayWithAFailedElement) {
  JobStatus s = slurm::StatusFromRecords(slurm::ParseScontrolRecords(kArrayDone), 4);
  ASSERT_EQ(s.elements.size(), 4u);
  EXPECT_EQ(s.elements[2].state, "failed");
  EXPECT_EQ(s.elements[2].exit_code, 7);
  for (int i : {0, 1, 3}) {
    EXPECT_EQ(s.elements[static_cast<size_t>(i)].state, "succeeded") << i;
  }
  EXPECT_EQ(s.state, "failed");
  EXPECT_EQ(s.exit_code, 7);
  EXPECT_TRUE(Contains(s.detail, "element 2 failed")) << s.detail;
}

TEST(ParseScontrol, AllPendingArrayIsPending) {
  JobStatus s = slurm::StatusFromRecords(
      slurm::ParseScontrolRecords("JobId=9 ArrayJobId=9 ArrayTaskId=0-3%2 "
                                  "JobState=PENDING Reason=Resources ExitCode=0:0\n"),
      4);
  EXPECT_EQ(s.state, "pending");
  for (const auto& e : s.elements) EXPECT_EQ(e.state, "pending");
}

TEST(ParseScontrol, UnreportedElementsAreLeftEmpty) {
  JobStatus s = slurm::StatusFromRecords(
      slurm::ParseScontrolRecords("JobId=12 ArrayJobId=10 ArrayTaskId=1 JobState=RUNNING\n"), 3);
  EXPECT_EQ(s.elements[0].state, "");
  EXPECT_EQ(s.elements[1].state, "running");
  EXPECT_EQ(s.elements[2].state, "");
  EXPECT_EQ(s.state, "running");
}

TEST(ParseScontrol, CancelledJobFromSignal) {
  JobStatus s = slurm::StatusFromRecords(
      slurm::ParseScontrolRecords(
          "JobId=8 JobName=c JobState=CANCELLED Reason=None ExitCode=0:15 NodeList=n[1-2]\n"),
      0);
  EXPECT_EQ(s.state, "cancelled");
  EXPECT_EQ(s.exit_code, 128 + 15);
  EXPECT_TRUE(Contains(s.detail, "signal 15")) << s.detail;
}

TEST(SlurmState, Mapping) {
  EXPECT_EQ(slurm::MapJobState("PENDING"), "pending");
  EXPECT_EQ(slurm::MapJobState("CONFIGURING"), "pending");
  EXPECT_EQ(slurm::MapJobState("REQUEUED"), "pending");
  EXPECT_EQ(slurm::MapJobState("RUNNING"), "running");
  EXPECT_EQ(slurm::MapJobState("COMPLETING"), "running");
  EXPECT_EQ(slurm::MapJobState("SUSPENDED"), "running");
  EXPECT_EQ(slurm::MapJobState("COMPLETED"), "succeeded");
  EXPECT_EQ(slurm::MapJobState("FAILED"), "failed");
  EXPECT_EQ(slurm::MapJobState("TIMEOUT"), "failed");
  EXPECT_EQ(slurm::MapJobState("NODE_FAIL"), "failed");
  EXPECT_EQ(slurm::MapJobState("OUT_OF_MEMORY"), "failed");
  EXPECT_EQ(slurm::MapJobState("BOOT_FAIL"), "failed");
  EXPECT_EQ(slurm::MapJobState("PREEMPTED"), "failed");
  EXPECT_EQ(slurm::MapJobState("CANCELLED"), "cancelled");
  EXPECT_EQ(slurm::MapJobState("CANCELLED by 0"), "cancelled");
  EXPECT_EQ(slurm::MapJobState("CANCELLED+"), "cancelled");
  EXPECT_EQ(slurm::MapJobState("SOMETHING_NEW"), "running");  // keep polling
}

TEST(SlurmState, ExitCodes) {
  EXPECT_EQ(slurm::ParseExitCode("0:0"), 0);
  EXPECT_EQ(slurm::ParseExitCode("3:0"), 3);
  EXPECT_EQ(slurm::ParseExitCode("0:9"), 137);
  EXPECT_EQ(slurm::ParseExitCode("0:15"), 143);
  EXPECT_FALSE(slurm::ParseExitCode("").has_value());
  EXPECT_FALSE(slurm::ParseExitCode("x:y").has_value());
  EXPECT_FALSE(slurm::ParseExitCode("3").has_value());
}

TEST(SlurmState, TaskIds) {
  EXPECT_EQ(slurm::ParseTaskIds("3"), (std::vector<int>{3}));
  EXPECT_EQ(slurm::ParseTaskIds("2-5%2"), (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(slurm::ParseTaskIds("0,4-8:2"), (std::vector<int>{0, 4, 6, 8}));
  EXPECT_TRUE(slurm::ParseTaskIds("").empty());
  EXPECT_TRUE(slurm::ParseTaskIds("5-2").empty());
  EXPECT_TRUE(slurm::ParseTaskIds("a-b").empty());
  EXPECT_TRUE(slurm::ParseTaskIds("(null)").empty());
}

TEST(SlurmFiles, StateOfAJobSlurmForgot) {
  TempDir dir;
  dir.File("slurm-5.exit", "0\n");
  auto e = slurm::StatusFromFiles(dir.path(), "5");
  EXPECT_EQ(e.state, "succeeded");
  EXPECT_EQ(e.exit_code, 0);

  dir.File("slurm-6_2.exit", "4\n");
  e = slurm::StatusFromFiles(dir.path(), "6_2");
  EXPECT_EQ(e.state, "failed");
  EXPECT_EQ(e.exit_code, 4);

  // Output captured from a cancelled job: slurmstepd's notice, no exit file.
  dir.File("slurm-8.out",
           "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
           "slurmstepd-n1: error: *** STEP 8.0 ON n1 CANCELLED AT 2026-11-29T14:56:24 ***\n"
           "slurmstepd-n1: error: *** JOB 8 ON n1 CANCELLED AT 2026-11-29T14:56:24 ***\n");
  e = slurm::StatusFromFiles(dir.path(), "8");
  EXPECT_EQ(e.state, "cancelled");

  dir.File("slurm-9.out",
           "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-29T15:00:00 "
           "DUE TO TIME LIMIT ***\n");
  EXPECT_EQ(slurm::StatusFromFiles(dir.path(), "9").state, "failed");

  dir.File("slurm-10.out", "hello\n");
  e = slurm::StatusFromFiles(dir.path(), "10");
  EXPECT_EQ(e.state, "lost");
  EXPECT_TRUE(Contains(e.detail, "slurm-10.out")) << e.detail;

  e = slurm::StatusFromFiles(dir.path(), "11");
  EXPECT_EQ(e.state, "lost");
  EXPECT_TRUE(Contains(e.detail, "no output")) << e.detail;
}

ElementRecord Element(int index, const std::string& state, std::optional<int> exit_code) {
  ElementRecord e;
  e.index = index;
  e.state = state;
  e.exit_code = exit_code;
  return e;
}

TEST(Aggregate, CancelledArray) {
  JobStatus s;
  s.elements = {Element(0, "succeeded", 0), Element(1, "cancelled", 143),
                Element(2, "cancelled", std::nullopt)};
  slurm::AggregateElements(&s);
  EXPECT_EQ(s.state, "cancelled");
  s.elements[2].state = "failed";
  s.elements[2].exit_code = 1;
  slurm::AggregateElements(&s);
  EXPECT_EQ(s.state, "failed");
  EXPECT_EQ(s.exit_code, 1);
  s.elements = {Element(0, "succeeded", 0), Element(1, "succeeded", 0)};
  slurm::AggregateElements(&s);
  EXPECT_EQ(s.state, "succeeded");
  EXPECT_EQ(s.exit_code, 0);
}

// --- validation ---------------------------------------------------------------------------

// `sinfo -h -o "%P %D %c %m %G"` of the fake cluster, plus a GPU partition with two node
// configurations (lines of one partition add up).
const char* kSinfo =
    "debug* 3 2 4096 (null)\n"
    "gpu 2 32 257000 gpu:a100:4(S:0-1)\n"
    "gpu 1 64+ 512000+ gpu:8,mps:100\n";

TEST(ParseSinfo, Partitions) {
  auto parts = slurm::ParseSinfo(kSinfo);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].name, "debug");
  EXPECT_TRUE(parts[0].is_default);
  EXPECT_EQ(parts[0].nodes, 3);
  EXPECT_EQ(parts[0].max_cpus, 2);
  EXPECT_EQ(parts[0].max_memory_mib, 4096);
  EXPECT_EQ(parts[0].max_gpus, 0);
  EXPECT_EQ(parts[1].name, "gpu");
  EXPECT_FALSE(parts[1].is_default);
  EXPECT_EQ(parts[1].nodes, 3);
  EXPECT_EQ(parts[1].max_cpus, 64);
  EXPECT_EQ(parts[1].max_memory_mib, 512000);
  EXPECT_EQ(parts[1].max_gpus, 8);
}

bool HasProblem(const std::vector<Problem>& ps, const std::string& where,
                const std::string& fragment) {
  for (const auto& p : ps) {
    if (p.where == where && p.what.find(fragment) != std::string::npos) return true;
  }
  return false;
}

TEST(Validate, AgainstPartitions) {
  auto parts = slurm::ParseSinfo(kSinfo);
  JobSpec spec = BaseSpec();
  spec.min_nodes = 2;
  spec.max_nodes = 3;
  std::vector<Problem> ps;
  slurm::CheckAgainstPartitions(spec, parts, &ps);
  EXPECT_TRUE(ps.empty()) << FormatProblems(ps);

  spec.max_nodes = 4;
  spec.resources.cpu = 3;
  spec.resources.memory_bytes = int64_t{8} << 30;
  spec.resources.memory_text = "8Gi";
  spec.resources.gpu = 1;
  ps.clear();
  slurm::CheckAgainstPartitions(spec, parts, &ps);
  EXPECT_TRUE(HasProblem(ps, "nnodes", "partition 'debug' has 3")) << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "resources.cpu", "has 2")) << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "resources.memory", "8Gi")) << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "resources.gpu", "no node")) << FormatProblems(ps);

  spec.queue = "gpu";
  spec.max_nodes = 3;
  ps.clear();
  slurm::CheckAgainstPartitions(spec, parts, &ps);
  EXPECT_TRUE(ps.empty()) << FormatProblems(ps);
  spec.resources.gpu = 9;
  slurm::CheckAgainstPartitions(spec, parts, &ps);
  EXPECT_TRUE(HasProblem(ps, "resources.gpu", "at most 8")) << FormatProblems(ps);

  spec.queue = "nope";
  ps.clear();
  slurm::CheckAgainstPartitions(spec, parts, &ps);
  EXPECT_TRUE(HasProblem(ps, "queue", "debug, gpu")) << FormatProblems(ps);
}

TEST(Validate, SpecChecks) {
  JobSpec spec = BaseSpec();
  spec.priority = "high";
  spec.volumes.resize(2);
  spec.volumes[0].name = "data";
  spec.volumes[0].host_path = "/mnt/data";
  spec.volumes[1].name = "c";
  spec.volumes[1].claim = "pvc";
  spec.mounts = {{.volume = "data", .path = "/data"}};
  spec.min_nodes = spec.max_nodes = 2;
  spec.rdzv.backend = "etcd";
  std::vector<Problem> ps;
  slurm::CheckSpec(spec, &ps);
  EXPECT_TRUE(HasProblem(ps, "priority", "number")) << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "volumes[1]", "host_path")) << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "mounts[0].path", "/mnt/data")) << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "rdzv.endpoint", "etcd")) << FormatProblems(ps);
}

TEST(Validate, UnreachableSlurmIsOneProblem) {
  // No Slurm client on PATH: one problem that says so, nothing else.
  const char* old = std::getenv("PATH");
  std::string saved = old ? old : "";
  TempDir empty;
  ::setenv("PATH", empty.path().c_str(), 1);
  auto backend = MakeSlurmBackend({.home = empty.path(), .cohort_bin = "/bin/true"});
  std::vector<Problem> ps;
  backend->Validate(BaseSpec(), {}, &ps);
  ::setenv("PATH", saved.c_str(), 1);
  ASSERT_EQ(ps.size(), 1u) << FormatProblems(ps);
  EXPECT_TRUE(Contains(ps[0].what, "Slurm is unreachable")) << ps[0].what;
  EXPECT_EQ(backend->name(), "slurm");
}

TEST(LogPath, FilesOfJobsAndElements) {
  auto backend = MakeSlurmBackend({.home = "/h", .cohort_bin = "cohort"});
  JobRecord job;
  job.id = 3;
  job.log_dir = "/h/logs/3";
  job.backend_id = "17";
  EXPECT_EQ(*backend->LogPath(job, -1, -1), "/h/logs/3/slurm-17.out");
  EXPECT_FALSE(backend->LogPath(job, 0, -1).ok());
  job.array_size = 4;
  EXPECT_EQ(*backend->LogPath(job, 2, -1), "/h/logs/3/slurm-17_2.out");
  auto whole = backend->LogPath(job, -1, -1);
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(whole.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(backend->LogPath(job, 4, -1).ok());

  TempDir dir;
  job.log_dir = dir.path();
  dir.File("1/ranks/20/attempt_0/3/stdout.log", "first\n");
  dir.File("1/ranks/20/attempt_1/3/stdout.log", "second\n");
  EXPECT_EQ(*backend->LogPath(job, 1, 3), dir.path() + "/1/ranks/20/attempt_1/3/stdout.log");
  EXPECT_EQ(backend->LogPath(job, 1, 4).status().code(), StatusCode::kNotFound);
}

// --- the backend against stand-in Slurm commands ---------------------------------------

// sbatch, scontrol, scancel and sinfo replaced by scripts on PATH that print what the test
// put in $FAKE_DIR/<command>.out / .err and exit with <command>.rc; sbatch also records its
// arguments, its COHORT_JOB_ID and a copy of the script.
class FakeSlurm : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("PATH");
    saved_path_ = path ? path : "";
    for (const char* cmd : {"sbatch", "scontrol", "scancel", "sinfo"}) {
      std::string body = fmt::format(
          "#!/bin/bash\n"
          "d=\"$FAKE_DIR\"\n"
          "printf '%s\\n' \"$@\" > \"$d/{0}.args\"\n"
          "if [ {0} = sbatch ]; then\n"
          "  printf '%s' \"$COHORT_JOB_ID\" > \"$d/sbatch.jobid\"\n"
          "  cp \"${{!#}}\" \"$d/sbatch.script\"\n"
          "fi\n"
          "[ -f \"$d/{0}.out\" ] && cat \"$d/{0}.out\"\n"
          "[ -f \"$d/{0}.err\" ] && cat \"$d/{0}.err\" >&2\n"
          "exit $(cat \"$d/{0}.rc\" 2>/dev/null || echo 0)\n",
          cmd);
      dir_.File(std::string("bin/") + cmd, body, true);
    }
    ::setenv("PATH", (dir_.path() + "/bin:" + saved_path_).c_str(), 1);
    ::setenv("FAKE_DIR", dir_.path().c_str(), 1);
    backend_ = MakeSlurmBackend({.home = dir_.path(), .cohort_bin = "/opt/cohort"});
    job_.id = 12;
    job_.name = "fmnist";
    job_.log_dir = dir_.path() + "/logs/12";
    job_.backend_id = "77";
  }
  void TearDown() override {
    ::setenv("PATH", saved_path_.c_str(), 1);
    ::unsetenv("FAKE_DIR");
  }
  void Answer(const std::string& cmd, const std::string& out, const std::string& err = "",
              int rc = 0) {
    dir_.File(cmd + ".out", out);
    dir_.File(cmd + ".err", err);
    dir_.File(cmd + ".rc", std::to_string(rc));
  }

  TempDir dir_;
  std::string saved_path_;
  std::unique_ptr<Backend> backend_;
  JobRecord job_;
};

TEST_F(FakeSlurm, SubmitWritesTheScriptAndReturnsTheJobId) {
  Answer("sbatch", "77;cohorttest\n");
  auto id = backend_->Submit(job_, BaseSpec(), {});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "77");
  const std::string script = job_.log_dir + "/job.sbatch";
  EXPECT_EQ(dir_.Read("sbatch.args"), "--parsable\n" + script + "\n");
  EXPECT_EQ(dir_.Read("sbatch.jobid"), "12");
  EXPECT_EQ(dir_.Read("sbatch.script"), *RenderSbatch(BaseSpec(), {}, "/opt/cohort", job_.log_dir));
  auto perms = fs::status(script).permissions();
  EXPECT_EQ(perms & (fs::perms::group_all | fs::perms::others_all), fs::perms::none);
}

TEST_F(FakeSlurm, SubmitRefusedBySlurm) {
  Answer("sbatch", "",
         "sbatch: error: Batch job submission failed: Requested node configuration is not "
         "available\n",
         1);
  auto id = backend_->Submit(job_, BaseSpec(), {});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(id.status().message(), "Requested node configuration is not available"))
      << id.status().message();

  Answer("sbatch", "",
         "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
         "(connect failure)\n",
         1);
  id = backend_->Submit(job_, BaseSpec(), {});
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kUnavailable) << id.status().ToString();
  EXPECT_TRUE(Contains(id.status().message(), "does not answer")) << id.status().message();
}

TEST_F(FakeSlurm, PollReadsScontrol) {
  Answer("scontrol", kFailedJob);
  auto s = backend_->Poll(job_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(dir_.Read("scontrol.args"), "show\njob\n-o\n77\n");
  EXPECT_EQ(s->state, "failed");
  EXPECT_EQ(s->exit_code, 3);
}

TEST_F(FakeSlurm, PollFallsBackToFilesOnceSlurmForgot) {
  Answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1);
  dir_.File("logs/12/slurm-77.exit", "0\n");
  auto s = backend_->Poll(job_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->state, "succeeded");
  EXPECT_EQ(s->exit_code, 0);

  // An array: element 1 still known to Slurm, the others from their files.
  job_.array_size = 4;
  Answer("scontrol", "JobId=80 ArrayJobId=77 ArrayTaskId=1 JobState=RUNNING NodeList=n2\n");
  dir_.File("logs/12/slurm-77_0.exit", "0\n");
  dir_.File("logs/12/slurm-77_2.out",
            "slurmstepd: error: *** JOB 81 ON n1 CANCELLED AT "
            "2026-11-29T15:00:00 ***\n");
  s = backend_->Poll(job_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->elements.size(), 4u);
  EXPECT_EQ(s->elements[0].state, "succeeded");
  EXPECT_EQ(s->elements[1].state, "running");
  EXPECT_EQ(s->elements[2].state, "cancelled");
  EXPECT_EQ(s->elements[3].state, "lost");
  EXPECT_EQ(s->elements[3].log_dir, job_.log_dir + "/3");
  EXPECT_EQ(s->state, "running");

  Answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1);
  dir_.File("logs/12/slurm-77_1.exit", "5\n");
  s = backend_->Poll(job_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->elements[1].state, "failed");
  EXPECT_EQ(s->state, "failed");
  EXPECT_EQ(s->exit_code, 5);
}

TEST_F(FakeSlurm, PollWithoutController) {
  Answer("scontrol", "",
         "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", 1);
  auto s = backend_->Poll(job_);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(s.status().message(), "controller does not answer")) << s.status().message();
}

TEST_F(FakeSlurm, Cancel) {
  Answer("scancel", "");
  EXPECT_TRUE(backend_->Cancel(job_).ok());
  EXPECT_EQ(dir_.Read("scancel.args"), "77\n");
  Answer("scancel", "", "scancel: error: Invalid job id 77\n", 1);
  EXPECT_EQ(backend_->Cancel(job_).code(), StatusCode::kNotFound);
  Answer("scancel", "",
         "scancel: error: Kill job error on job id 77: Job/step already completing or "
         "completed\n",
         1);
  EXPECT_EQ(backend_->Cancel(job_).code(), StatusCode::kFailedPrecondition);
}

TEST_F(FakeSlurm, ValidateAsksSinfo) {
  Answer("sinfo", kSinfo);
  JobSpec spec = BaseSpec();
  spec.min_nodes = spec.max_nodes = 4;
  std::vector<Problem> ps;
  backend_->Validate(spec, {}, &ps);
  EXPECT_EQ(dir_.Read("sinfo.args"), "-h\n-o\n%P %D %c %m %G\n");
  EXPECT_TRUE(HasProblem(ps, "nnodes", "partition 'debug' has 3")) << FormatProblems(ps);
  EXPECT_EQ(ps.size(), 1u) << FormatProblems(ps);

  Answer("sinfo", "", "sinfo: error: Unable to contact slurm controller (connect failure)\n", 1);
  ps.clear();
  backend_->Validate(BaseSpec(), {}, &ps);
  ASSERT_EQ(ps.size(), 1u) << FormatProblems(ps);
  EXPECT_TRUE(Contains(ps[0].what, "Slurm is unreachable")) << ps[0].what;
}


// --- accelerators, placement, metrics, arguments, dry runs and clusters -----------------

TEST(RenderSbatch, ExtendedResourcesBecomeGresAndMetricsAFlag) {
  JobSpec spec = BaseSpec();
  spec.resources.gpu = 2;
  spec.resources.extended = {{"aws.amazon.com/neuron", 1}, {"vpc.amazonaws.com/efa", 4}};
  spec.metrics.port = 9400;
  auto script = RenderSbatch(spec, {}, "cohort", "/logs/3");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  auto lines = SbatchLines(*script);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "--gres=gpu:2,neuron:1,efa:4"), lines.end())
      << *script;
  EXPECT_TRUE(Contains(*script, "--metrics-port 9400 --metrics-host 0.0.0.0")) << *script;
  EXPECT_EQ(slurm::GresName("nvidia.com/gpu"), "gpu");
  EXPECT_EQ(slurm::GresName("example.com/fpga"), "fpga");
}

TEST(Validate, ExtendedResourcesAgainstPartitionGresAndNodeSelectors) {
  auto parts = slurm::ParseSinfo(
      "trn* 2 64 512000 neuron:16,efa:8\n"
      "cpu 4 32 128000 (null)\n");
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].max_gres.at("neuron"), 16);
  JobSpec spec = BaseSpec();
  spec.resources.extended = {{"aws.amazon.com/neuron", 16}, {"vpc.amazonaws.com/efa", 8}};
  std::vector<Problem> ps;
  slurm::CheckAgainstPartitions(spec, parts, &ps);
  EXPECT_TRUE(ps.empty()) << FormatProblems(ps);
  spec.resources.extended["vpc.amazonaws.com/efa"] = 9;
  spec.resources.extended["example.com/fpga"] = 1;
  slurm::CheckAgainstPartitions(spec, parts, &ps);
  EXPECT_TRUE(HasProblem(ps, "resources.extended.vpc.amazonaws.com/efa", "at most 8"))
      << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "resources.extended.example.com/fpga", "no node of partition 'trn'"))
      << FormatProblems(ps);
  // Node labels are a Kubernetes matter; tolerations have nothing to do on Slurm.
  JobSpec placed = BaseSpec();
  placed.placement.node_selector = {{"zone", "a"}};
  placed.placement.tolerations = {Toleration{.key = "k", .op = "Exists"}};
  ps.clear();
  slurm::CheckSpec(placed, &ps);
  ASSERT_EQ(ps.size(), 1u) << FormatProblems(ps);
  EXPECT_TRUE(HasProblem(ps, "placement.node_selector", "cannot choose nodes by label"));
}

TEST_F(RenderedScriptRun, ElementArgumentsCarryTheElementsVariables) {
  JobSpec spec = BaseSpec();
  spec.args = {"train.py", "--data", "${DATA}", "--region=$REGION", "$RANK"};
  std::vector<ArrayElement> elements = {{0, {{"REGION", "us-east-1"}, {"DATA", "s3://b/e"}}},
                                        {1, {{"REGION", "eu west"}, {"DATA", "it's"}}}};
  auto script = RenderSbatch(spec, elements, cohort_, dir_.path());
  ASSERT_TRUE(script.ok());
  ASSERT_EQ(Run(*script, "SLURM_ARRAY_JOB_ID=40 SLURM_ARRAY_TASK_ID=1"), 0)
      << dir_.Read("script.out");
  EXPECT_TRUE(Contains(dir_.Read("node0"), "[train.py]\n[--data]\n[it's]\n[--region=eu west]\n[$RANK]\n"))
      << dir_.Read("node0");
}

TEST_F(FakeSlurm, DryRunRendersWithoutSlurmAndSaysWhatWasNotChecked) {
  Answer("sinfo", "", "sinfo: error: Unable to contact slurm controller (connect failure)\n", 1);
  auto backend = MakeSlurmBackend({.home = dir_.path(), .cohort_bin = "/opt/cohort", .dry_run = true});
  std::vector<Problem> ps;
  backend->Validate(BaseSpec(), {}, &ps);
  EXPECT_TRUE(ps.empty()) << FormatProblems(ps);
  auto script = backend->Render(BaseSpec(), {});
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  EXPECT_TRUE(StartsWith(*script, "#!/bin/bash\n# cohort: not checked against Slurm's partitions "
                                  "(sinfo failed: the Slurm controller does not answer"))
      << *script;
  // Specs the script cannot carry are still refused offline.
  JobSpec bad = BaseSpec();
  bad.priority = "high";
  ps.clear();
  backend->Validate(bad, {}, &ps);
  EXPECT_TRUE(HasProblem(ps, "priority", "number")) << FormatProblems(ps);
}

TEST_F(FakeSlurm, AClusterTargetReachesEveryCommand) {
  auto backend = MakeSlurmBackend(
      {.home = dir_.path(), .cohort_bin = "/opt/cohort", .slurm_cluster = "c2"});
  Answer("sbatch", "77;c2\n");
  auto id = backend->Submit(job_, BaseSpec(), {});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "77");
  EXPECT_TRUE(StartsWith(dir_.Read("sbatch.args"), "-M\nc2\n--parsable\n")) << dir_.Read("sbatch.args");
  EXPECT_TRUE(Contains(dir_.Read("sbatch.script"), "\n#SBATCH --clusters=c2\n"));
  Answer("scancel", "");
  EXPECT_TRUE(backend->Cancel(job_).ok());
  EXPECT_EQ(dir_.Read("scancel.args"), "-M\nc2\n77\n");
}

}  // namespace
}  // namespace cohort::launch
