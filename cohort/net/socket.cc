// Implements socket.h with poll(2)-based deadlines. Thread-safety: see socket.h.
#include "cohort/net/socket.h"

#include "cohort/base/backoff.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace cohort::net {
namespace {

Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoStatus("fcntl(O_NONBLOCK)", errno);
  }
  return Status::Ok();
}

Result<sockaddr_in> MakeAddress(std::string_view host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    return addr;
  }
  COHORT_ASSIGN_OR_RETURN(std::string ip, ResolveIpv4(host));
  if (::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("not an IPv4 address: {}", ip);
  }
  return addr;
}

// Waits for `events` on fd until the deadline. Returns false on timeout.
Result<bool> PollFd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.PollTimeoutMs());
    if (rc > 0) return true;
    if (rc == 0) {
      if (deadline.expired()) return false;
      continue;
    }
    if (errno == EINTR) continue;
    return ErrnoStatus("poll", errno);
  }
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.Release();
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

Status Socket::SendAll(const void* data, size_t size, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      COHORT_ASSIGN_OR_RETURN(bool ready, PollFd(fd_, POLLOUT, deadline));
      if (!ready) return DeadlineExceeded("send to {} timed out", PeerName());
      continue;
    }
    return ErrnoStatus(fmt::format("send to {}", PeerName()), errno);
  }
  return Status::Ok();
}

Status Socket::RecvAll(void* data, size_t size, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(fd_, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      COHORT_ASSIGN_OR_RETURN(bool ready, PollFd(fd_, POLLIN, deadline));
      if (!ready) return DeadlineExceeded("receive from {} timed out", PeerName());
      continue;
    }
    return ErrnoStatus(fmt::format("recv from {}", PeerName()), errno);
  }
  return Status::Ok();
}

Result<bool> Socket::WaitReadable(Deadline deadline) { return PollFd(fd_, POLLIN, deadline); }

Result<int> Socket::LocalPort() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return ErrnoStatus("getsockname", errno);
  }
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

std::string Socket::PeerName() const {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (fd_ < 0 || ::getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      addr.sin_family != AF_INET) {
    return "?";
  }
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
  return fmt::format("{}:{}", ip, ntohs(addr.sin_port));
}

Result<Socket> Listen(const ListenOptions& options) {
  COHORT_ASSIGN_OR_RETURN(sockaddr_in addr, MakeAddress(options.host, options.port));
  Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  if (options.reuse_addr) ::setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(fmt::format("bind {}:{}", options.host, options.port), errno);
  }
  if (::listen(sock.fd(), options.backlog) != 0) {
    return ErrnoStatus(fmt::format("listen {}:{}", options.host, options.port), errno);
  }
  COHORT_RETURN_IF_ERROR(SetNonBlocking(sock.fd()));
  return sock;
}

Result<Socket> ReservePort(std::string_view host, int port) {
  COHORT_ASSIGN_OR_RETURN(sockaddr_in addr, MakeAddress(host, port));
  Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return ErrnoStatus("socket", errno);
  int one = 1;
  ::setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(fmt::format("bind {}:{}", host, port), errno);
  }
  return sock;
}

Result<Socket> Connect(std::string_view host, int port, Deadline deadline) {
  // A name that does not resolve yet (a pod's DNS record appears after the pod starts) is
  // looked up again until the deadline, like a refused connection.
  Backoff lookup(std::chrono::milliseconds(5), std::chrono::milliseconds(1000), deadline);
  auto addr = MakeAddress(host, port);
  while (!addr.ok() && addr.status().code() == StatusCode::kNotFound && lookup.Sleep()) {
    addr = MakeAddress(host, port);
  }
  if (!addr.ok()) return addr.status();
  Backoff refused(std::chrono::milliseconds(5), std::chrono::milliseconds(500), deadline);
  Status last = Unavailable("connect to {}:{}: no attempt made", host, port);
  for (;;) {
    Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!sock.valid()) return ErrnoStatus("socket", errno);
    int rc = ::connect(sock.fd(), reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr));
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      COHORT_ASSIGN_OR_RETURN(bool ready, PollFd(sock.fd(), POLLOUT, deadline));
      if (!ready) {
        return DeadlineExceeded("connect to {}:{} timed out", host, port);
      }
      socklen_t len = sizeof(err);
      ::getsockopt(sock.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      int one = 1;
      ::setsockopt(sock.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return sock;
    }
    last = ErrnoStatus(fmt::format("connect to {}:{}", host, port), err);
    if (last.code() != StatusCode::kUnavailable || !refused.Sleep()) break;
  }
  if (last.code() == StatusCode::kUnavailable) {
    return DeadlineExceeded("{} (gave up at the deadline)", last.message());
  }
  return last;
}

Result<std::string> ResolveIpv4(std::string_view host) {
  std::string h(host);
  in_addr probe{};
  if (::inet_pton(AF_INET, h.c_str(), &probe) == 1) return h;
  if (h == "localhost") return std::string("127.0.0.1");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(h.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return NotFound("cannot resolve host '{}': {}", h, ::gai_strerror(rc));
  }
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, ip, sizeof(ip));
  ::freeaddrinfo(res);
  return std::string(ip);
}

bool IsLocalHost(std::string_view host) {
  auto ip = ResolveIpv4(host);
  if (!ip.ok()) return false;
  if (ip->rfind("127.", 0) == 0 || *ip == "0.0.0.0") return true;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* it = list; it != nullptr && !found; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf,
                sizeof(buf));
    found = (*ip == buf);
  }
  ::freeifaddrs(list);
  return found;
}

std::string HostName() {
  utsname u{};
  if (::uname(&u) != 0) return "localhost";
  return u.nodename;
}

}  // namespace cohort::net
