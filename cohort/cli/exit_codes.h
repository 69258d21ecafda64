// Exit codes of the cohort binary, documented in docs/exit-codes.md. Distinct per cause so
// scripts can tell a typo from a crash. Thread-safety: constants.
#pragma once

namespace cohort::cli {

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
inline constexpr int kExitInternal = 70;      // a bug or an OS failure (EX_SOFTWARE)
inline constexpr int kExitNotFound = 127;     // the entrypoint does not exist (as a shell)
// 128 + N: cohort was stopped by signal N (130 for SIGINT), after stopping its workers.

}  // namespace cohort::cli
