// Implements subprocess.h with fork/exec, pidfd_open and pipes. Thread-safety: see header.
#include "cohort/base/subprocess.h"

#include <fcntl.h>
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

#include "cohort/base/strings.h"

extern char** environ;

namespace cohort {

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

void CloseDescriptorsExcept(int keep) {
  auto close_range = [](unsigned first, unsigned last) {
    if (first > last) return;
    if (::syscall(SYS_close_range, first, last, 0u) == 0) return;
    const long max = std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 20);
    for (long fd = first; fd <= std::min<long>(last, max); ++fd) ::close(static_cast<int>(fd));
  };
  if (keep > 3) close_range(3, static_cast<unsigned>(keep) - 1);
  close_range(static_cast<unsigned>(std::max(keep + 1, 3)), ~0u);
}

namespace {

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

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
  const char* path = std::getenv("PATH");
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

Result<Child> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return InvalidArgument("Spawn: empty argv");
  COHORT_ASSIGN_OR_RETURN(std::string program, FindProgram(options.argv[0]));

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
  int out_file = -1;
  auto close_all = [&] {
    for (int* p : {out_pipe, err_pipe, exec_pipe}) {
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
      ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    int err = errno;
    close_all();
    return ErrnoStatus("pipe", err);
  }
  // Everything the child touches is prepared before fork (no allocation after it).
  std::vector<char*> argv, envp;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : options.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    close_all();
    return ErrnoStatus("fork", err);
  }
  if (pid == 0) {
    // Child: own process group, die with the parent, default signal state.
    if (options.new_session) {
      ::setsid();
    } else {
      ::setpgid(0, 0);
    }
    ::prctl(PR_SET_PDEATHSIG, options.death_signal);
    if (options.death_signal != 0 && ::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
    }
    if (capture) {
      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
    } else if (out_file >= 0) {
      ::dup2(out_file, STDOUT_FILENO);
      ::dup2(out_file, STDERR_FILENO);
    }
    if (!options.working_dir.empty() && ::chdir(options.working_dir.c_str()) != 0) {
      int err = errno;
      [[maybe_unused]] ssize_t n = ::write(exec_pipe[1], &err, sizeof(err));
      ::_exit(127);
    }
    // Nothing of this process's sockets (a store's listening socket, its connections)
    // reaches the program, even where a descriptor lacks close-on-exec.
    CloseDescriptorsExcept(exec_pipe[1]);
    ::execve(program.c_str(), argv.data(), envp.data());
    int err = errno;
    [[maybe_unused]] ssize_t n = ::write(exec_pipe[1], &err, sizeof(err));
    ::_exit(127);
  }
  // Parent.
  if (!options.new_session) ::setpgid(pid, pid);  // also here: no race with an early SignalGroup
  CloseFd(out_file);
  CloseFd(out_pipe[1]);
  CloseFd(err_pipe[1]);
  CloseFd(exec_pipe[1]);
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
    return ErrnoStatus(fmt::format("cannot execute {}", program), exec_errno);
  }
  Child child;
  child.pid = pid;
  child.pidfd = PidfdOpen(pid);
  if (child.pidfd < 0) {
    int err = errno;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    CloseFd(out_pipe[0]);
    CloseFd(err_pipe[0]);
    return ErrnoStatus("pidfd_open", err);
  }
  ::fcntl(child.pidfd, F_SETFD, FD_CLOEXEC);
  for (int fd : {out_pipe[0], err_pipe[0]}) {
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  child.out_fd = out_pipe[0];
  child.err_fd = err_pipe[0];
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
