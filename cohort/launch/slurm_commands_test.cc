// Unit tests of the slurm backend against stand-in Slurm commands (sbatch, scontrol, scancel
// and sinfo replaced by scripts on PATH): Submit writes the script and returns the job id or
// Slurm's refusal, Poll reads scontrol and falls back to files once Slurm forgot a job,
// Cancel, Validate asks sinfo, a dry run renders without Slurm, and a cluster target reaches
// every command.
#include "cohort/launch/slurm_backend.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "cohort/base/strings.h"
#include "cohort/base/temp_dir.h"
#include "cohort/launch/slurm_test_util.h"

namespace cohort::launch::slurm_test {
namespace {

namespace fs = std::filesystem;

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
  EXPECT_EQ(s->state, JobState::kFailed);
  EXPECT_EQ(s->exit_code, 3);
}

TEST_F(FakeSlurm, PollFallsBackToFilesOnceSlurmForgot) {
  Answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1);
  dir_.File("logs/12/slurm-77.exit", "0\n");
  auto s = backend_->Poll(job_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->state, JobState::kSucceeded);
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
  EXPECT_EQ(s->elements[0].state, JobState::kSucceeded);
  EXPECT_EQ(s->elements[1].state, JobState::kRunning);
  EXPECT_EQ(s->elements[2].state, JobState::kCancelled);
  EXPECT_EQ(s->elements[3].state, JobState::kLost);
  EXPECT_EQ(s->elements[3].log_dir, job_.log_dir + "/3");
  EXPECT_EQ(s->state, JobState::kRunning);

  Answer("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", 1);
  dir_.File("logs/12/slurm-77_1.exit", "5\n");
  s = backend_->Poll(job_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->elements[1].state, JobState::kFailed);
  EXPECT_EQ(s->state, JobState::kFailed);
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

// --- dry runs and clusters ----------------------------------------------------------------

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
}  // namespace cohort::launch::slurm_test
