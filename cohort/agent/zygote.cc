// Implements Zygote (see zygote.h). The channel is a SOCK_SEQPACKET socket pair: every
// message is one JSON object, requests carry the worker's stdin, stdout and stderr.
#include "cohort/agent/zygote.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace cohort::agent {

Status BecomeSubreaper() {
  static const int err = ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0 ? 0 : errno;
  if (err) return ErrnoStatus("prctl(PR_SET_CHILD_SUBREAPER)", err);
  return Status::Ok();
}

void ReapAdoptedOrphans(const std::vector<pid_t>& known) {
  for (;;) {
    siginfo_t info{};
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    if (std::find(known.begin(), known.end(), info.si_pid) != known.end()) return;
    ::waitpid(info.si_pid, nullptr, 0);
  }
}

Result<std::unique_ptr<Zygote>> Zygote::Start(const ZygoteOptions& options) {
  COHORT_RETURN_IF_ERROR(BecomeSubreaper());
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoStatus("socketpair", errno);
  }
  SpawnOptions so;
  so.argv.push_back(options.python);
  for (const auto& f : options.flags) so.argv.push_back(f);
  so.argv.push_back(options.zygote_script);
  for (const auto& m : options.preload) so.argv.push_back(m);
  so.env = options.env;
  so.env.push_back("COHORT_ZYGOTE_FD=3");
  so.capture_output = false;  // its own messages (none, normally) go to the agent's stderr
  so.pass_fd = sv[1];
  auto child = Spawn(so);
  ::close(sv[1]);
  if (!child.ok()) {
    ::close(sv[0]);
    return child.status();
  }
  std::unique_ptr<Zygote> z(new Zygote());
  z->child_ = *child;
  z->sock_ = sv[0];
  return z;
}

Zygote::~Zygote() {
  CloseFd(sock_);
  if (child_.pid > 0) {
    // Killed, not waited for: tearing down an interpreter that mapped torch takes the
    // kernel ~30 ms, which the launcher's exit need not wait out. A dead child left
    // unreaped is reaped by whoever adopts it (init) once this process is gone.
    SignalGroup(child_.pid, SIGKILL);
    ::waitpid(child_.pid, nullptr, WNOHANG);
  }
  CloseFd(child_.pidfd);
}

Result<std::string> Zygote::Receive(Deadline deadline) {
  for (;;) {
    pollfd p{sock_, POLLIN, 0};
    int n = ::poll(&p, 1, deadline.PollTimeoutMs());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("poll", errno);
    if (n == 0) return DeadlineExceeded("the warm interpreter did not answer in time");
    std::string buf(1 << 16, '\0');
    ssize_t got = ::recv(sock_, buf.data(), buf.size(), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoStatus("recv", errno);
    if (got == 0) return Unavailable("the warm interpreter exited");
    buf.resize(static_cast<size_t>(got));
    return buf;
  }
}

Status Zygote::Ready(Deadline deadline) {
  if (ready_) return Status::Ok();
  if (!failed_.ok()) return failed_;
  auto msg = Receive(deadline);
  if (msg.ok()) {
    auto j = nlohmann::json::parse(*msg, nullptr, false);
    if (j.is_object() && j.value("ready", false)) {
      ready_ = true;
      return Status::Ok();
    }
    failed_ = FailedPrecondition(
        "{}", j.is_object() ? j.value("error", std::string("bad message")) : "bad message");
  } else {
    failed_ = msg.status();
  }
  CloseFd(sock_);
  return failed_;
}

Result<Child> Zygote::SpawnWorker(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& orig_argv, bool module,
                                  const std::vector<std::string>& env, const std::string& cwd,
                                  Deadline deadline) {
  COHORT_RETURN_IF_ERROR(Ready(deadline));
  char here[4096];
  nlohmann::json req = {{"argv", argv},
                        {"orig_argv", orig_argv},
                        {"module", module},
                        {"env", env},
                        {"cwd", !cwd.empty() ? cwd : std::string(::getcwd(here, sizeof(here)))},
                        {"agent", ::getpid()}};
  const std::string body = req.dump();
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    for (int* p : {out, err}) CloseFd(p[0]), CloseFd(p[1]);
    return ErrnoStatus("pipe", e);
  }
  int fds[3] = {STDIN_FILENO, out[1], err[1]};
  char control[CMSG_SPACE(sizeof(fds))] = {};
  iovec iov{const_cast<char*>(body.data()), body.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(cm), fds, sizeof(fds));
  ssize_t sent;
  do {
    sent = ::sendmsg(sock_, &mh, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  const int send_errno = errno;
  CloseFd(out[1]);
  CloseFd(err[1]);
  auto fail = [&](Status st) -> Result<Child> {
    CloseFd(out[0]);
    CloseFd(err[0]);
    return st;
  };
  if (sent < 0) return fail(ErrnoStatus("send to the warm interpreter", send_errno));
  auto reply = Receive(deadline);
  if (!reply.ok()) return fail(reply.status());
  auto j = nlohmann::json::parse(*reply, nullptr, false);
  if (!j.is_object() || !j.contains("pid")) {
    return fail(Internal("the warm interpreter could not start the worker: {}",
                         j.is_object() ? j.value("error", std::string("bad reply")) : *reply));
  }
  // The worker is our child now (we are its subreaper): watched and reaped as any other.
  return AdoptChild(j["pid"].get<pid_t>(), out[0], err[0]);
}

}  // namespace cohort::agent
