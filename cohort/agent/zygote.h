// Zygote: a warm Python interpreter per node (cohort_zygote.py) that has imported torch and
// the user's --preload modules before the workers need them, and forks each worker of every
// attempt, so that a restart does not pay for the interpreter start and `import torch`.
//
// A forked worker is adopted by this process (which becomes a child subreaper) and is from
// then on an ordinary child: it is watched through its pidfd, reaped with Reap() and
// signalled through its process group, exactly as a worker from Spawn(). The worker runs in
// an environment, working directory, argv and __main__ of its own (cohort_zygote.py lists
// what it restores). When the zygote cannot start or preload fails, Ready() says why and the
// agent starts workers fresh.
//
// Thread-safety: one owner thread (the agent's monitor thread, which must also be the
// thread that lives as long as the workers: see subprocess.h on PDEATHSIG).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/time.h"

namespace cohort::agent {

struct ZygoteOptions {
  std::string python;                    // the interpreter
  std::vector<std::string> flags;        // its options before the script (e.g. "-u")
  std::vector<std::string> preload;      // modules to import first ("torch", ...)
  std::string zygote_script;             // path of cohort_zygote.py
  std::vector<std::string> env;          // the zygote's environment ("K=V")
};

class Zygote {
 public:
  // Starts the interpreter; it imports the preload modules in the background.
  static Result<std::unique_ptr<Zygote>> Start(const ZygoteOptions& options);
  ~Zygote();  // closes the channel and SIGKILLs the zygote (not waiting for its teardown)

  // Waits until the preload finished: Ok, or why the zygote cannot serve (then it is gone).
  Status Ready(Deadline deadline);
  // Readable when the zygote has said whether it is ready (then Ready() does not block);
  // -1 once it is known.
  int ready_fd() const { return ready_ || !failed_.ok() ? -1 : sock_; }

  // Forks a worker running `argv` (argv[0] is the script, or the module with `module`), with
  // the full environment `env` and working directory `cwd` (empty: ours). Its stdout and
  // stderr are pipes whose read ends the Child holds, as Spawn's capture_output.
  Result<Child> SpawnWorker(const std::vector<std::string>& argv,
                            const std::vector<std::string>& orig_argv, bool module,
                            const std::vector<std::string>& env, const std::string& cwd,
                            Deadline deadline);

  pid_t pid() const { return child_.pid; }

 private:
  Zygote() = default;
  Result<std::string> Receive(Deadline deadline);
  Child child_;
  int sock_ = -1;
  bool ready_ = false;
  Status failed_;
};

// Makes this process a child subreaper (orphaned descendants are re-parented to it), once.
Status BecomeSubreaper();
// Reaps exited children that are not in `known` (adopted orphans); never blocks.
void ReapAdoptedOrphans(const std::vector<pid_t>& known);

}  // namespace cohort::agent
