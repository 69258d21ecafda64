// Subprocess helpers: spawn a child in its own process group that dies with its parent,
// with stdout/stderr on pipes and a pidfd that becomes readable the instant it exits.
//
// Thread-safety: Spawn may be called from any thread, but PR_SET_PDEATHSIG fires when the
// *thread* that spawned it exits, so spawn workers from a thread that lives as long as they do
// (the agent's main thread). A Child is owned by one thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"

namespace cohort {

struct SpawnOptions {
  std::vector<std::string> argv;       // argv[0] is resolved through PATH
  std::vector<std::string> env;        // full environment, "KEY=VALUE"
  std::string working_dir;             // empty = inherit
  bool capture_output = true;          // stdout/stderr to pipes (else inherited)
  std::string output_file;             // non-empty: stdout+stderr appended here (no pipes)
  int death_signal = 9;                // signal the child gets when the spawning thread dies
                                       // (0: none, the child outlives its parent)
  bool new_session = false;            // setsid: detached from the terminal and its signals
  int pass_fd = -1;                    // >= 0: given to the child as descriptor 3
  bool stdin_pipe = false;             // stdin from a pipe (Child::in_fd), else inherited
};

struct Child {
  pid_t pid = -1;
  int pidfd = -1;   // readable when the child exits
  int out_fd = -1;  // read ends of the stdout/stderr pipes (non-blocking), -1 if not captured
  int err_fd = -1;
  int in_fd = -1;   // write end of the stdin pipe (non-blocking) with stdin_pipe, else -1
};

// Forks and execs. Errors from exec (program missing, not executable) are reported to the
// caller through a close-on-exec pipe, not as a child that exits 127.
Result<Child> Spawn(const SpawnOptions& options);

// The Child of a process that is already this process's child (started by Spawn, or
// adopted as a subreaper): its pidfd, and `out_fd`/`err_fd` (-1: none) made non-blocking.
// On failure the process is killed and reaped and the descriptors are closed.
Result<Child> AdoptChild(pid_t pid, int out_fd, int err_fd);

// Closes `fd` when it is open and sets it to -1.
void CloseFd(int& fd);

// Sends `sig` to the child's process group (its pgid is its pid).
void SignalGroup(pid_t pid, int sig);

// Decoded wait status.
struct ExitStatus {
  bool exited = false;
  int code = 0;    // exit code when exited
  int signal = 0;  // terminating signal otherwise
  bool success() const { return exited && code == 0; }
  std::string Describe() const;
};
// Reaps `pid` (blocking); call after its pidfd became readable.
ExitStatus Reap(pid_t pid);

// pidfd_open(2): a descriptor that becomes readable when `pid` exits; -1 on error.
int PidfdOpen(pid_t pid);
// In a forked child before exec (async-signal-safe): closes every descriptor from 3 up
// except `keep` (-1: none), so nothing of the parent's reaches the child.
void CloseDescriptorsExcept(int keep);
// The same from `first` up (first >= 3): descriptors below `first` are kept too.
void CloseDescriptorsFrom(int first, int keep);

// Finds `program` like execvp would: absolute/relative paths are checked directly,
// bare names through PATH. Returns the path or kNotFound / kPermissionDenied.
Result<std::string> FindProgram(const std::string& program);

// What a command printed and how it ended.
struct CapturedOutput {
  ExitStatus status;
  std::string out;
  std::string err;
};

// Runs `argv` (environment `env`, "KEY=VALUE"; empty: this process's) to its end with
// `input` on its stdin and its stdout and stderr collected. At the deadline its process
// group is killed and reaped: DeadlineExceeded naming the command. A program that cannot
// start is the error Spawn gives (kNotFound when it is not on PATH). Never SIGPIPE: a
// command that stops reading its input just gets the rest dropped.
Result<CapturedOutput> RunAndCapture(const std::vector<std::string>& argv,
                                     const std::vector<std::string>& env,
                                     const std::string& input, Deadline deadline);

// Current environment as "KEY=VALUE" strings, without the keys in `remove`, with
// `overrides` replacing or adding keys.
std::vector<std::string> MergeEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides,
    const std::vector<std::string>& remove = {});

}  // namespace cohort
