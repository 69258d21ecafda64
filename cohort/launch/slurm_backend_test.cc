// Unit tests of the slurm backend's sbatch script without Slurm: its #SBATCH lines, the srun
// line, shell quoting, arrays, extended resources and metrics; the script is also run with
// stand-in srun/scontrol/cohort programs to check what the agents would receive. Parsing,
// states and validation: slurm_status_test.cc; the backend against stand-in Slurm commands:
// slurm_commands_test.cc. The real cluster is exercised by tests/slurm/.
#include "cohort/launch/slurm_backend.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "cohort/base/strings.h"
#include "cohort/base/temp_dir.h"
#include "cohort/launch/slurm_test_util.h"

namespace cohort::launch::slurm_test {
namespace {

namespace fs = std::filesystem;

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

// --- accelerators, metrics, arguments ---------------------------------------------------

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

}  // namespace
}  // namespace cohort::launch::slurm_test
