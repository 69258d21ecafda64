// The exit codes of every cohort binary: the launcher (`cohort run`, the job commands) and
// the worker programs (cohort-train, cohort bench). One table, so a number means one thing
// wherever a script sees it; docs/exit-codes.md lists them. Thread-safety: constants.
#pragma once

#include "cohort/base/status.h"

namespace cohort {

inline constexpr int kExitOk = 0;
inline constexpr int kExitWorkerFailed = 1;   // a worker failed and the restart budget is spent
inline constexpr int kExitUsage = 2;          // unknown flag, missing entrypoint, bad syntax
inline constexpr int kExitInvalidValue = 3;   // a flag value that cannot work (--nnodes 3:1)
inline constexpr int kExitRendezvous = 4;     // store unreachable, join timeout
inline constexpr int kExitPortInUse = 5;      // a port cohort must bind is taken
inline constexpr int kExitInvalidSpec = 6;    // job spec or array input invalid; nothing submitted
inline constexpr int kExitBackend = 7;        // the backend failed (sbatch/kubectl, job history)
inline constexpr int kExitNoSuchJob = 8;      // status/logs/cancel of an unknown job or log
inline constexpr int kExitJobCancelled = 9;   // submit --wait / status --wait: job cancelled
// Worker programs.
inline constexpr int kExitCannotJoinJob = 10;  // started into a multi-rank job, could not join
inline constexpr int kExitData = 11;           // the data set cannot be read
inline constexpr int kExitCheckpoint = 12;     // a checkpoint of another model, or unreadable
inline constexpr int kExitComm = 13;           // a collective failed during training
inline constexpr int kExitInternal = 70;       // a bug or an OS failure (EX_SOFTWARE)
inline constexpr int kExitNotFound = 127;      // the entrypoint does not exist (as a shell)
// 128 + N: stopped by signal N (130 for SIGINT), after stopping the workers; also how a
// child killed by signal N is reported (as a shell does).
constexpr int ExitCodeForSignal(int signal) { return 128 + signal; }

// Who reads a failed Status as an exit code: the launcher (`cohort run`, its agent) or a job
// command (submit, status, logs, cancel, pipeline). A status code means one thing in each.
enum class ExitContext { kLauncher, kJobCommand };

// The exit code of a command that failed with `s` (kExitOk for an ok status), by its code:
//   code                 launcher            job command
//   kInvalidArgument     kExitInvalidValue   kExitUsage
//   kFailedPrecondition  kExitInvalidValue   kExitInvalidValue
//   kNotFound            kExitNotFound       kExitNoSuchJob
//   kAlreadyExists       kExitPortInUse      `otherwise`
//   kUnavailable,
//   kDeadlineExceeded,
//   kPermissionDenied    kExitRendezvous     kExitBackend
//   kCancelled           `otherwise`         kExitJobCancelled
// and `otherwise` for the rest (a bug or an OS failure: kExitInternal, unless the caller
// knows better).
inline int ExitCodeFor(const Status& s, ExitContext where, int otherwise = kExitInternal) {
  const bool launcher = where == ExitContext::kLauncher;
  switch (s.code()) {
    case StatusCode::kOk: return kExitOk;
    case StatusCode::kInvalidArgument: return launcher ? kExitInvalidValue : kExitUsage;
    case StatusCode::kFailedPrecondition: return kExitInvalidValue;
    case StatusCode::kNotFound: return launcher ? kExitNotFound : kExitNoSuchJob;
    case StatusCode::kAlreadyExists: return launcher ? kExitPortInUse : otherwise;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kPermissionDenied: return launcher ? kExitRendezvous : kExitBackend;
    case StatusCode::kCancelled: return launcher ? otherwise : kExitJobCancelled;
    default: return otherwise;
  }
}

}  // namespace cohort
