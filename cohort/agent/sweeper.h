// JobSweeper: nothing a job's workers start outlives the agent, even when the agent is
// SIGKILLed or a descendant left its worker's process group (`setsid`, a daemonizing
// script).
//
// Every worker gets COHORT_JOB_COOKIE=<random> in its environment (worker_env.h), which
// its descendants inherit. SweepNow() SIGKILLs every process of this machine carrying the
// cookie; the agent calls it after it stopped a worker group. A helper process, forked at
// construction into its own process group, holds the read end of a pipe whose only write
// end is the agent's: when the agent goes away, however it ends, the helper reads EOF,
// sweeps the same way and exits. A process that scrubs its whole environment escapes this;
// nothing else does.
//
// Thread-safety: construct and destroy on one thread; SweepNow() from that thread. The
// helper runs only async-signal-safe code (it is forked from a multi-threaded process).
#pragma once

#include <sys/types.h>

#include <string>

namespace cohort::agent {

class JobSweeper {
 public:
  JobSweeper();
  ~JobSweeper();  // the helper sweeps and exits; waited for (bounded)
  JobSweeper(const JobSweeper&) = delete;
  JobSweeper& operator=(const JobSweeper&) = delete;

  const std::string& cookie() const { return cookie_; }
  // Kills every process carrying the cookie until none is left; returns how many.
  int SweepNow();

 private:
  std::string cookie_;
  std::string needle_;  // "COHORT_JOB_COOKIE=<cookie>" with its terminating NUL
  int pipe_write_ = -1;
  pid_t helper_ = -1;
  int helper_pidfd_ = -1;
};

}  // namespace cohort::agent
