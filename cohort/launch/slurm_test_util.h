// Test-only helpers shared by the slurm backend's tests (slurm_backend_test.cc,
// slurm_status_test.cc, slurm_commands_test.cc): the base spec, the problem and substring
// checks, and `scontrol show job -o` / `sinfo` output captured from a real Slurm 22.05.
//
// Thread-safety: test code; called from the test's own thread.
#pragma once

#include <string>
#include <vector>

#include "cohort/launch/job_spec.h"

namespace cohort::launch::slurm_test {

inline JobSpec BaseSpec() {
  JobSpec spec;
  spec.name = "fmnist";
  spec.entrypoint = "python3";
  spec.args = {"train.py", "--epochs", "3"};
  return spec;
}

inline bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

inline bool HasProblem(const std::vector<Problem>& ps, const std::string& where,
                       const std::string& fragment) {
  for (const auto& p : ps) {
    if (p.where == where && p.what.find(fragment) != std::string::npos) return true;
  }
  return false;
}

// Captured from Slurm 22.05 (tests/slurm's fake cluster): a finished 3-node job that failed
// with exit code 3.
inline constexpr const char* kFailedJob =
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

// `sinfo -h -o "%P %D %c %m %G"` of the fake cluster, plus a GPU partition with two node
// configurations (lines of one partition add up).
inline constexpr const char* kSinfo =
    "debug* 3 2 4096 (null)\n"
    "gpu 2 32 257000 gpu:a100:4(S:0-1)\n"
    "gpu 1 64+ 512000+ gpu:8,mps:100\n";

}  // namespace cohort::launch::slurm_test
