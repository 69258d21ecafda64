// JobSweeper: nothing a job starts outlives it, even when the process that runs the job
// (the agent, the pipeline executor) is SIGKILLed or a descendant left its process group
// (`setsid`, a daemonizing script).
//
// The job's processes get COHORT_JOB_COOKIE=<cookie> (or <cookie>.<part> for one part of
// the job, e.g. a pipeline step) in their environment, which their descendants inherit.
// SweepNow() SIGKILLs every process of this machine carrying the cookie or any of its
// parts; Sweep(part) only those of one part. A helper process, forked at construction into
// its own process group, holds the read end of a pipe whose only write end is ours: when
// this process goes away, however it ends, the helper reads EOF, sweeps every part and
// exits, then removes the directory it was given, if any. A process that scrubs its whole
// environment escapes this; nothing else does.
//
// Thread-safety: construct and destroy on one thread; SweepNow() and Sweep() from any
// thread (they only read /proc and send signals). The helper runs only async-signal-safe
// code (it is forked from a multi-threaded process).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace cohort {

class JobSweeper {
 public:
  // After its sweep the helper removes the shared-memory segments named with the cookie
  // (/dev/shm/cohort-<cookie>-*: libcohort's, whose creator was killed before it could
  // unlink them) and `remove_dir` (optional) with everything in it (the agent's private
  // runtime directory): nothing of it outlives the agent, SIGKILL included.
  explicit JobSweeper(std::string remove_dir = "");
  ~JobSweeper();  // the helper sweeps and exits; waited for (bounded)
  JobSweeper(const JobSweeper&) = delete;
  JobSweeper& operator=(const JobSweeper&) = delete;

  // The value of COHORT_JOB_COOKIE for the whole job, and for one part of it.
  const std::string& cookie() const { return cookie_; }
  std::string CookieFor(std::string_view part) const;
  // Kill every process carrying the cookie (or one of its parts), until none is left;
  // return how many.
  int SweepNow() const;
  // Unlinks the shared-memory segments named with the cookie; returns how many.
  int RemoveSegments() const;
  int Sweep(std::string_view part) const;

 private:
  std::string cookie_;
  std::string family_;  // "COHORT_JOB_COOKIE=<cookie>": matches the cookie and its parts
  int pipe_write_ = -1;
  pid_t helper_ = -1;
  int helper_pidfd_ = -1;
};

}  // namespace cohort
