// Implements JobSweeper (sweeper.h). The /proc scan uses only system calls and buffers on
// the stack, so the forked helper may run it. Thread-safety: see sweeper.h.
#include "cohort/base/sweeper.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "cohort/base/log.h"
#include "cohort/base/strings.h"
#include "cohort/base/subprocess.h"
#include "cohort/base/worker_env.h"

namespace cohort {
namespace {

// How an environment entry must continue after the needle ("NAME=value"): the value ends
// there, or (a family) it also may go on with ".<part>".
enum class Match { kExact, kFamily };

// True when /proc/<pid>/environ holds an entry that starts with `needle` and continues as
// `match` allows.
bool EnvironHolds(int proc_fd, const char* pid, const char* needle, size_t needle_len,
                  Match match) {
  char path[64];
  size_t n = 0;
  for (const char* p = pid; *p && n < 40; ++p) path[n++] = *p;
  const char kTail[] = "/environ";
  for (size_t i = 0; i < sizeof(kTail); ++i) path[n++] = kTail[i];
  int fd = ::openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // A window that keeps the last needle_len + 1 bytes of the previous read, so an entry
  // across two reads is still found; entries start after a NUL (or at offset 0). The
  // environment ends with a NUL, so the byte after a match is always read.
  const size_t span = needle_len + 1;
  char buf[16384];
  size_t have = 1;
  buf[0] = '\0';
  bool found = false;
  for (;;) {
    ssize_t r = ::read(fd, buf + have, sizeof(buf) - have);
    if (r <= 0) break;
    size_t end = have + static_cast<size_t>(r);
    for (size_t i = 1; i + span <= end; ++i) {
      if (buf[i - 1] != '\0' || std::memcmp(buf + i, needle, needle_len) != 0) continue;
      const char next = buf[i + needle_len];
      if (next == '\0' || (match == Match::kFamily && next == '.')) {
        found = true;
        break;
      }
    }
    if (found) break;
    size_t keep = span < end ? span : end;
    std::memmove(buf, buf + end - keep, keep);
    have = keep;
  }
  ::close(fd);
  return found;
}

// SIGKILLs every process (but this one) whose environment holds `needle`; returns how
// many. Async-signal-safe.
int KillHolders(const char* needle, size_t needle_len, Match match) {
  int proc_fd = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc_fd < 0) return 0;
  const pid_t self = ::getpid();
  int killed = 0;
  alignas(8) char entries[8192];
  for (;;) {
    long n = ::syscall(SYS_getdents64, proc_fd, entries, sizeof(entries));
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<struct dirent64*>(entries + off);
      off += d->d_reclen;
      const char* name = d->d_name;
      if (name[0] < '1' || name[0] > '9') continue;
      pid_t pid = 0;
      bool numeric = true;
      for (const char* p = name; *p; ++p) {
        if (*p < '0' || *p > '9') {
          numeric = false;
          break;
        }
        pid = pid * 10 + (*p - '0');
      }
      if (!numeric || pid == self) continue;
      if (EnvironHolds(proc_fd, name, needle, needle_len, match) &&
          ::kill(pid, SIGKILL) == 0) {
        ++killed;
      }
    }
  }
  ::close(proc_fd);
  return killed;
}

// Sweeps until a pass finds nobody (a process may fork while it is being killed).
int SweepAll(const char* needle, size_t needle_len, Match match) {
  int total = 0;
  for (int pass = 0; pass < 50; ++pass) {
    int killed = KillHolders(needle, needle_len, match);
    total += killed;
    if (killed == 0) break;
  }
  return total;
}

}  // namespace

JobSweeper::JobSweeper(std::string remove_dir)
    : cookie_(RandomHex(12)), family_(std::string(worker_env::kJobCookie) + "=" + cookie_) {
  // Built before the fork: the helper may only exec it (async-signal-safe). The cookie is
  // hex, so the pattern needs no quoting.
  const std::string script = "rm -rf -- \"$1\" /dev/shm/cohort-" + cookie_ + "-*";
  const char* rm_argv[] = {"sh", "-c", script.c_str(), "sh", remove_dir.c_str(), nullptr};
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    COHORT_LOG_WARN("sweeper", "no orphan sweeper (pipe: {}); leftovers of a SIGKILLed job "
                    "may survive it", std::strerror(errno));
    return;
  }
  const char* needle = family_.data();
  const size_t needle_len = family_.size();
  pid_t pid = ::fork();
  if (pid == 0) {
    // Helper: its own process group (group signals to the workers miss it), no signals
    // from the terminal, nothing inherited but the pipe.
    ::setpgid(0, 0);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2}) {
      ::signal(sig, SIG_IGN);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // Nothing of the agent's but the pipe: no listening socket held, no console kept open.
    int null_fd = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3 && null_fd >= 0; ++fd) ::dup2(null_fd, fd);
    CloseDescriptorsExcept(fds[0]);
    char byte;
    while (true) {
      ssize_t r = ::read(fds[0], &byte, 1);
      if (r == 0 || (r < 0 && errno != EINTR)) break;  // the agent is gone
    }
    SweepAll(needle, needle_len, Match::kFamily);
    ::execv("/bin/sh", const_cast<char* const*>(rm_argv));
    ::_exit(0);
  }
  ::close(fds[0]);
  if (pid < 0) {
    ::close(fds[1]);
    COHORT_LOG_WARN("sweeper", "no orphan sweeper (fork: {})", std::strerror(errno));
    return;
  }
  pipe_write_ = fds[1];
  helper_ = pid;
  helper_pidfd_ = PidfdOpen(pid);
}

JobSweeper::~JobSweeper() {
  if (pipe_write_ >= 0) ::close(pipe_write_);
  if (helper_ <= 0) return;
  // The helper sweeps (milliseconds) and exits; do not hang on it if /proc misbehaves.
  if (helper_pidfd_ >= 0) {
    pollfd p{helper_pidfd_, POLLIN, 0};
    if (::poll(&p, 1, 10000) == 0) ::kill(helper_, SIGKILL);
    ::close(helper_pidfd_);
  }
  int status;
  while (::waitpid(helper_, &status, 0) < 0 && errno == EINTR) {
  }
}

int JobSweeper::RemoveSegments() const {
  const std::string prefix = "cohort-" + cookie_ + "-";
  int removed = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
      removed += ::shm_unlink(("/" + std::string(e->d_name)).c_str()) == 0;
    }
    ::closedir(d);
  }
  return removed;
}

std::string JobSweeper::CookieFor(std::string_view part) const {
  return cookie_ + "." + std::string(part);
}

int JobSweeper::SweepNow() const { return SweepAll(family_.data(), family_.size(), Match::kFamily); }

int JobSweeper::Sweep(std::string_view part) const {
  const std::string needle = std::string(worker_env::kJobCookie) + "=" + CookieFor(part);
  return SweepAll(needle.data(), needle.size(), Match::kExact);
}

}  // namespace cohort
