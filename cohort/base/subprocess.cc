// Implements subprocess.h with clone(CLONE_VM|CLONE_VFORK) + exec, pidfd_open and pipes.
// Thread-safety: see header.
#include "cohort/base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include "cohort/base/settings.h"
#include "cohort/base/strings.h"

extern char** environ;

namespace cohort {

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

void CloseDescriptorsExcept(int keep) { CloseDescriptorsFrom(3, keep); }

void CloseDescriptorsFrom(int first, int keep) {
  auto close_range = [](unsigned first, unsigned last) {
    if (first > last) return;
    if (::syscall(SYS_close_range, first, last, 0u) == 0) return;
    const long max = std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 20);
    for (long fd = first; fd <= std::min<long>(last, max); ++fd) ::close(static_cast<int>(fd));
  };
  if (keep > first) close_range(first, static_cast<unsigned>(keep) - 1);
  close_range(static_cast<unsigned>(std::max(keep + 1, first)), ~0u);
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::string ExitStatus::Describe() const {
  if (exited) return fmt::format("exit code {}", code);
  const char* name = sigabbrev_np(signal);
  return name ? fmt::format("signal SIG{}", name) : fmt::format("signal {}", signal);
}

Result<std::string> FindProgram(const std::string& program) {
  auto check = [](const std::string& path) -> Status {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return NotFound("{} does not exist", path);
    if (S_ISDIR(st.st_mode)) return PermissionDenied("{} is a directory", path);
    if (::access(path.c_str(), X_OK) != 0) return PermissionDenied("{} is not executable", path);
    return Status::Ok();
  };
  if (program.empty()) return InvalidArgument("empty program name");
  if (program.find('/') != std::string::npos) {
    COHORT_RETURN_IF_ERROR(check(program));
    return program;
  }
  const std::optional<std::string> path_env = SystemEnv("PATH");
  const char* path = path_env ? path_env->c_str() : nullptr;
  for (const auto& dir : Split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    std::string candidate = dir + "/" + program;
    if (check(candidate).ok()) return candidate;
  }
  return NotFound("'{}' was not found on PATH", program);
}

std::vector<std::string> MergeEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides,
    const std::vector<std::string>& remove) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  for (const auto& k : remove) env.erase(k);
  for (const auto& [k, v] : overrides) env[k] = v;
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

namespace {

// What a spawned child needs, prepared by the parent before clone (the child shares our
// memory and may not allocate).
struct ChildSetup {
  const SpawnOptions* options;
  const char* program;
  char* const* argv;
  char* const* envp;
  pid_t parent;
  bool capture;
  int out_w, err_w, out_file, exec_w, in_r;
};

// The child between clone and exec: default signal state, its own process group (or
// session), death with its parent, its streams, nothing else inherited. An error before
// exec goes to the parent through exec_w.
int ChildMain(void* arg) {
  const ChildSetup& c = *static_cast<const ChildSetup*>(arg);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (c.options->new_session) {
    ::setsid();
  } else {
    ::setpgid(0, 0);
  }
  ::prctl(PR_SET_PDEATHSIG, c.options->death_signal);
  if (c.options->death_signal != 0 && ::getppid() != c.parent) ::_exit(127);
  if (c.in_r >= 0) ::dup2(c.in_r, STDIN_FILENO);
  if (c.capture) {
    ::dup2(c.out_w, STDOUT_FILENO);
    ::dup2(c.err_w, STDERR_FILENO);
  } else if (c.out_file >= 0) {
    ::dup2(c.out_file, STDOUT_FILENO);
    ::dup2(c.out_file, STDERR_FILENO);
  }
  int err = 0;
  if (!c.options->working_dir.empty() && ::chdir(c.options->working_dir.c_str()) != 0) {
    err = errno;
  } else {
    // Nothing of this process's sockets (a store's listening socket, its connections)
    // reaches the program, even where a descriptor lacks close-on-exec; but the descriptor
    // it is given (as 3; exec_w is never 3 then).
    if (c.options->pass_fd >= 0) {
      ::dup2(c.options->pass_fd, 3);
      ::fcntl(3, F_SETFD, 0);
      CloseDescriptorsFrom(4, c.exec_w);
    } else {
      CloseDescriptorsExcept(c.exec_w);
    }
    ::execve(c.program, c.argv, c.envp);
    err = errno;
  }
  [[maybe_unused]] ssize_t n = ::write(c.exec_w, &err, sizeof(err));
  ::_exit(127);
}

}  // namespace

Result<Child> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return InvalidArgument("Spawn: empty argv");
  COHORT_ASSIGN_OR_RETURN(std::string program, FindProgram(options.argv[0]));

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
  int in_pipe[2] = {-1, -1};
  int out_file = -1;
  auto close_all = [&] {
    for (int* p : {out_pipe, err_pipe, exec_pipe, in_pipe}) {
      CloseFd(p[0]);
      CloseFd(p[1]);
    }
    CloseFd(out_file);
  };
  const bool capture = options.capture_output && options.output_file.empty();
  if (!options.output_file.empty()) {
    out_file = ::open(options.output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                      0644);
    if (out_file < 0) return ErrnoStatus(fmt::format("open {}", options.output_file), errno);
  }
  if ((capture && (::pipe2(out_pipe, O_CLOEXEC) != 0 ||
                                  ::pipe2(err_pipe, O_CLOEXEC) != 0)) ||
      (options.stdin_pipe && ::pipe2(in_pipe, O_CLOEXEC) != 0) ||
      ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    int err = errno;
    close_all();
    return ErrnoStatus("pipe", err);
  }
  if (options.pass_fd >= 0 && exec_pipe[1] <= 3) {  // descriptor 3 is the passed one
    int moved = ::fcntl(exec_pipe[1], F_DUPFD_CLOEXEC, 4);
    if (moved < 0) {
      int err = errno;
      close_all();
      return ErrnoStatus("fcntl", err);
    }
    CloseFd(exec_pipe[1]);
    exec_pipe[1] = moved;
  }
  // Everything the child touches is prepared before clone (no allocation after it).
  std::vector<char*> argv, envp;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : options.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();

  // clone(CLONE_VM | CLONE_VFORK) as posix_spawn does, not fork(): no page tables are
  // copied and no copy-on-write faults follow, so starting N workers costs O(N), not
  // O(N x agent size) (1000 workers: 14.7 s with fork). The child runs on its own stack in
  // our memory until it execs, touching nothing but what is prepared here; every signal is
  // blocked around the clone, so no handler of ours can run on the child's stack.
  ChildSetup setup{&options,   program.c_str(), argv.data(), envp.data(),
                   parent,     capture,         out_pipe[1], err_pipe[1],
                   out_file,   exec_pipe[1],    in_pipe[0]};
  constexpr size_t kChildStack = 64 << 10;
  std::unique_ptr<char[]> stack(new char[kChildStack]);
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &saved);
  pid_t pid = ::clone(ChildMain, stack.get() + kChildStack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                      &setup);
  const int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (pid < 0) {
    close_all();
    return ErrnoStatus("clone", clone_errno);
  }
  // Parent.
  if (!options.new_session) ::setpgid(pid, pid);  // also here: no race with an early SignalGroup
  CloseFd(out_file);
  CloseFd(out_pipe[1]);
  CloseFd(err_pipe[1]);
  CloseFd(exec_pipe[1]);
  CloseFd(in_pipe[0]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  CloseFd(exec_pipe[0]);
  if (n > 0) {
    ::waitpid(pid, nullptr, 0);
    CloseFd(out_pipe[0]);
    CloseFd(err_pipe[0]);
    CloseFd(in_pipe[1]);
    return ErrnoStatus(fmt::format("cannot execute {}", program), exec_errno);
  }
  auto child = AdoptChild(pid, out_pipe[0], err_pipe[0]);
  if (!child.ok()) {
    CloseFd(in_pipe[1]);
    return child;
  }
  if (in_pipe[1] >= 0) ::fcntl(in_pipe[1], F_SETFL, ::fcntl(in_pipe[1], F_GETFL) | O_NONBLOCK);
  child->in_fd = in_pipe[1];
  return child;
}

Result<CapturedOutput> RunAndCapture(const std::vector<std::string>& argv,
                                     const std::vector<std::string>& env,
                                     const std::string& input, Deadline deadline) {
  SpawnOptions so;
  so.argv = argv;
  so.env = env.empty() ? MergeEnvironment({}) : env;
  so.stdin_pipe = true;
  COHORT_ASSIGN_OR_RETURN(Child child, Spawn(so));
  if (input.empty()) CloseFd(child.in_fd);
  // Writing to a command that stopped reading must be EPIPE here, not a SIGPIPE death.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  CapturedOutput result;
  size_t written = 0;
  bool exited = false;
  int* read_fds[2] = {&child.out_fd, &child.err_fd};
  std::string* sinks[2] = {&result.out, &result.err};
  bool timed_out = false;
  while (child.in_fd >= 0 || child.out_fd >= 0 || child.err_fd >= 0 || !exited) {
    std::vector<pollfd> p;
    if (child.in_fd >= 0) p.push_back({child.in_fd, POLLOUT, 0});
    for (int* fd : read_fds) {
      if (*fd >= 0) p.push_back({*fd, POLLIN, 0});
    }
    if (!exited) p.push_back({child.pidfd, POLLIN, 0});
    int ready = ::poll(p.data(), p.size(), deadline.PollTimeoutMs());
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || deadline.expired()) {
      timed_out = true;
      break;
    }
    for (const pollfd& q : p) {
      if (q.revents == 0) continue;
      if (q.fd == child.pidfd) {
        exited = true;
      } else if (q.fd == child.in_fd) {
        ssize_t w = ::write(child.in_fd, input.data() + written, input.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        // Done, or the command stopped reading (EPIPE): its output says why.
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
          CloseFd(child.in_fd);
        }
      } else {
        for (int i = 0; i < 2; ++i) {
          if (q.fd != *read_fds[i]) continue;
          char buf[8192];
          ssize_t got = ::read(q.fd, buf, sizeof(buf));
          if (got > 0) {
            sinks[i]->append(buf, static_cast<size_t>(got));
          } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
            CloseFd(*read_fds[i]);
          }
        }
      }
    }
  }
  // A SIGPIPE raised while blocked is discarded before the old mask returns.
  struct timespec zero = {0, 0};
  while (::sigtimedwait(&pipe_set, nullptr, &zero) > 0) {
  }
  ::pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  if (timed_out) SignalGroup(child.pid, SIGKILL);
  for (int* fd : {&child.in_fd, &child.out_fd, &child.err_fd}) CloseFd(*fd);
  result.status = Reap(child.pid);
  CloseFd(child.pidfd);
  if (timed_out) {
    return DeadlineExceeded("`{}` did not finish in time (killed)", fmt::join(argv, " "));
  }
  return result;
}

Result<Child> AdoptChild(pid_t pid, int out_fd, int err_fd) {
  Child child;
  child.pid = pid;
  child.pidfd = PidfdOpen(pid);
  if (child.pidfd < 0) {
    int err = errno;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    CloseFd(out_fd);
    CloseFd(err_fd);
    return ErrnoStatus("pidfd_open", err);
  }
  ::fcntl(child.pidfd, F_SETFD, FD_CLOEXEC);
  for (int fd : {out_fd, err_fd}) {
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  child.out_fd = out_fd;
  child.err_fd = err_fd;
  return child;
}

void SignalGroup(pid_t pid, int sig) {
  if (pid > 0) ::kill(-pid, sig);
}

ExitStatus Reap(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  ExitStatus s;
  if (r == pid && WIFEXITED(status)) {
    s.exited = true;
    s.code = WEXITSTATUS(status);
  } else if (r == pid && WIFSIGNALED(status)) {
    s.signal = WTERMSIG(status);
  } else {
    s.exited = true;
    s.code = -1;
  }
  return s;
}

}  // namespace cohort
