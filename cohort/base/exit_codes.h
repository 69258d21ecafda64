// The exit codes of every cohort binary: the launcher (`cohort run`, the job commands) and
// the worker programs (cohort-train, cohort bench). One table, so a number means one thing
// wherever a script sees it; docs/exit-codes.md lists them. Thread-safety: constants.
#pragma once

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

}  // namespace cohort
