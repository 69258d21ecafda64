// Unit tests of the slurm backend's reading of Slurm without Slurm: the parsing of
// `scontrol show job -o` and `sinfo` output captured from a real Slurm 22.05, the state and
// exit code mapping, the fallback to the files a job leaves, the aggregate state of arrays,
// Validate against partitions and specs, and where a job's logs are.
#include "cohort/launch/slurm_backend.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <tuple>

#include "cohort/base/temp_dir.h"
#include "cohort/launch/slurm_test_util.h"

namespace cohort::launch::slurm_test {
namespace {

using slurm::Record;

// --- scontrol / sinfo parsing ----------------------------------------------------------

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
  EXPECT_EQ(s.state, JobState::kFailed);
  EXPECT_EQ(s.exit_code, 3);
  EXPECT_TRUE(Contains(s.detail, "FAILED (NonZeroExitCode), exit code 3")) << s.detail;
}

// Captured from Slurm 22.05 (tests/slurm's fake cluster): an array 0-3%2 whose element 2
// failed, while it ran and after it ended; trimmed to the fields the backend reads (the real
// lines carry all of kFailedJob's).
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
  EXPECT_EQ(s.elements[0].state, JobState::kSucceeded);
  EXPECT_EQ(s.elements[0].exit_code, 0);
  EXPECT_GT(s.elements[0].ended_at, s.elements[0].started_at - 1);
  EXPECT_GT(s.elements[0].started_at, 0);
  EXPECT_EQ(s.elements[1].state, JobState::kRunning);
  EXPECT_FALSE(s.elements[1].exit_code.has_value());
  EXPECT_EQ(s.elements[1].ended_at, 0);
  EXPECT_EQ(s.elements[2].state, JobState::kPending);
  EXPECT_EQ(s.elements[3].state, JobState::kPending);
  EXPECT_TRUE(Contains(s.elements[3].detail, "JobArrayTaskLimit")) << s.elements[3].detail;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.elements[static_cast<size_t>(i)].index, i);
  EXPECT_EQ(s.state, JobState::kRunning);
  EXPECT_FALSE(s.exit_code.has_value());
}

TEST(ParseScontrol, ArrayWithAFailedElement) {
  JobStatus s = slurm::StatusFromRecords(slurm::ParseScontrolRecords(kArrayDone), 4);
  ASSERT_EQ(s.elements.size(), 4u);
  EXPECT_EQ(s.elements[2].state, JobState::kFailed);
  EXPECT_EQ(s.elements[2].exit_code, 7);
  for (int i : {0, 1, 3}) {
    EXPECT_EQ(s.elements[static_cast<size_t>(i)].state, JobState::kSucceeded) << i;
  }
  EXPECT_EQ(s.state, JobState::kFailed);
  EXPECT_EQ(s.exit_code, 7);
  EXPECT_TRUE(Contains(s.detail, "element 2 failed")) << s.detail;
}

TEST(ParseScontrol, AllPendingArrayIsPending) {
  JobStatus s = slurm::StatusFromRecords(
      slurm::ParseScontrolRecords("JobId=9 ArrayJobId=9 ArrayTaskId=0-3%2 "
                                  "JobState=PENDING Reason=Resources ExitCode=0:0\n"),
      4);
  EXPECT_EQ(s.state, JobState::kPending);
  for (const auto& e : s.elements) EXPECT_EQ(e.state, JobState::kPending);
}

TEST(ParseScontrol, UnreportedElementsAreLeftUnknown) {
  JobStatus s = slurm::StatusFromRecords(
      slurm::ParseScontrolRecords("JobId=12 ArrayJobId=10 ArrayTaskId=1 JobState=RUNNING\n"), 3);
  EXPECT_EQ(s.elements[0].state, JobState::kUnknown);
  EXPECT_EQ(s.elements[1].state, JobState::kRunning);
  EXPECT_EQ(s.elements[2].state, JobState::kUnknown);
  EXPECT_EQ(s.state, JobState::kRunning);
}

TEST(ParseScontrol, CancelledJobFromSignal) {
  JobStatus s = slurm::StatusFromRecords(
      slurm::ParseScontrolRecords(
          "JobId=8 JobName=c JobState=CANCELLED Reason=None ExitCode=0:15 NodeList=n[1-2]\n"),
      0);
  EXPECT_EQ(s.state, JobState::kCancelled);
  EXPECT_EQ(s.exit_code, 128 + 15);
  EXPECT_TRUE(Contains(s.detail, "signal 15")) << s.detail;
}

TEST(SlurmState, Mapping) {
  EXPECT_EQ(slurm::MapJobState("PENDING"), JobState::kPending);
  EXPECT_EQ(slurm::MapJobState("CONFIGURING"), JobState::kPending);
  EXPECT_EQ(slurm::MapJobState("REQUEUED"), JobState::kPending);
  EXPECT_EQ(slurm::MapJobState("RUNNING"), JobState::kRunning);
  EXPECT_EQ(slurm::MapJobState("COMPLETING"), JobState::kRunning);
  EXPECT_EQ(slurm::MapJobState("SUSPENDED"), JobState::kRunning);
  EXPECT_EQ(slurm::MapJobState("COMPLETED"), JobState::kSucceeded);
  EXPECT_EQ(slurm::MapJobState("FAILED"), JobState::kFailed);
  EXPECT_EQ(slurm::MapJobState("TIMEOUT"), JobState::kFailed);
  EXPECT_EQ(slurm::MapJobState("NODE_FAIL"), JobState::kFailed);
  EXPECT_EQ(slurm::MapJobState("OUT_OF_MEMORY"), JobState::kFailed);
  EXPECT_EQ(slurm::MapJobState("BOOT_FAIL"), JobState::kFailed);
  EXPECT_EQ(slurm::MapJobState("PREEMPTED"), JobState::kFailed);
  EXPECT_EQ(slurm::MapJobState("CANCELLED"), JobState::kCancelled);
  EXPECT_EQ(slurm::MapJobState("CANCELLED by 0"), JobState::kCancelled);
  EXPECT_EQ(slurm::MapJobState("CANCELLED+"), JobState::kCancelled);
  EXPECT_EQ(slurm::MapJobState("SOMETHING_NEW"), JobState::kRunning);  // keep polling
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
  EXPECT_EQ(e.state, JobState::kSucceeded);
  EXPECT_EQ(e.exit_code, 0);

  dir.File("slurm-6_2.exit", "4\n");
  e = slurm::StatusFromFiles(dir.path(), "6_2");
  EXPECT_EQ(e.state, JobState::kFailed);
  EXPECT_EQ(e.exit_code, 4);

  // Output captured from a cancelled job: slurmstepd's notice, no exit file.
  dir.File("slurm-8.out",
           "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
           "slurmstepd-n1: error: *** STEP 8.0 ON n1 CANCELLED AT 2026-11-29T14:56:24 ***\n"
           "slurmstepd-n1: error: *** JOB 8 ON n1 CANCELLED AT 2026-11-29T14:56:24 ***\n");
  e = slurm::StatusFromFiles(dir.path(), "8");
  EXPECT_EQ(e.state, JobState::kCancelled);

  dir.File("slurm-9.out",
           "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-29T15:00:00 "
           "DUE TO TIME LIMIT ***\n");
  EXPECT_EQ(slurm::StatusFromFiles(dir.path(), "9").state, JobState::kFailed);

  dir.File("slurm-10.out", "hello\n");
  e = slurm::StatusFromFiles(dir.path(), "10");
  EXPECT_EQ(e.state, JobState::kLost);
  EXPECT_TRUE(Contains(e.detail, "slurm-10.out")) << e.detail;

  e = slurm::StatusFromFiles(dir.path(), "11");
  EXPECT_EQ(e.state, JobState::kLost);
  EXPECT_TRUE(Contains(e.detail, "no output")) << e.detail;
}

ElementRecord Element(int index, JobState state, std::optional<int> exit_code) {
  ElementRecord e;
  e.index = index;
  e.state = state;
  e.exit_code = exit_code;
  return e;
}

TEST(Aggregate, CancelledArray) {
  JobStatus s;
  s.elements = {Element(0, JobState::kSucceeded, 0), Element(1, JobState::kCancelled, 143),
                Element(2, JobState::kCancelled, std::nullopt)};
  slurm::AggregateElements(&s);
  EXPECT_EQ(s.state, JobState::kCancelled);
  s.elements[2].state = JobState::kFailed;
  s.elements[2].exit_code = 1;
  slurm::AggregateElements(&s);
  EXPECT_EQ(s.state, JobState::kFailed);
  EXPECT_EQ(s.exit_code, 1);
  s.elements = {Element(0, JobState::kSucceeded, 0), Element(1, JobState::kSucceeded, 0)};
  slurm::AggregateElements(&s);
  EXPECT_EQ(s.state, JobState::kSucceeded);
  EXPECT_EQ(s.exit_code, 0);
}

// --- validation ---------------------------------------------------------------------------

TEST(ParseSinfo, Partitions) {
  // Per partition, in sinfo's order: name, default, nodes, CPUs, memory (MiB), GPUs.
  const std::vector<std::tuple<std::string, bool, int, int, int64_t, int>> want = {
      {"debug", true, 3, 2, 4096, 0},
      {"gpu", false, 3, 64, 512000, 8},
  };
  auto parts = slurm::ParseSinfo(kSinfo);
  ASSERT_EQ(parts.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const slurm::Partition& p = parts[i];
    EXPECT_EQ(std::tie(p.name, p.is_default, p.nodes, p.max_cpus, p.max_memory_mib, p.max_gpus),
              want[i])
        << "partition " << i;
  }
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

}  // namespace
}  // namespace cohort::launch::slurm_test
