// Implements socket.h with poll(2)-based deadlines. Thread-safety: see socket.h.
#include "cohort/net/socket.h"

#include "cohort/base/backoff.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
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

// Names a socket for sock_diag by its four-tuple: source port and address, destination port
// and address (network byte order; `addr_bytes` 4 for IPv4, 16 for IPv6).
void SetDiagSocketId(inet_diag_sockid* id, uint16_t sport, const void* src, uint16_t dport,
                     const void* dst, size_t addr_bytes) {
  id->idiag_sport = sport;
  id->idiag_dport = dport;
  std::memcpy(id->idiag_src, src, addr_bytes);
  std::memcpy(id->idiag_dst, dst, addr_bytes);
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

Result<std::optional<uint32_t>> LocalPeerUid(int fd) {
  sockaddr_storage ours{}, theirs{};
  socklen_t ours_len = sizeof(ours), theirs_len = sizeof(theirs);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ours), &ours_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_len) != 0) {
    return ErrnoStatus("getsockname/getpeername", errno);
  }
  // The peer's socket, looked up by its exact four-tuple: source = the peer, destination =
  // us. One request, one answer (not a dump of every socket).
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } ask{};
  ask.header.nlmsg_len = sizeof(ask);
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST;
  ask.request.sdiag_family = static_cast<uint8_t>(theirs.ss_family);
  ask.request.sdiag_protocol = IPPROTO_TCP;
  ask.request.idiag_states = ~0u;
  ask.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  ask.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (theirs.ss_family == AF_INET) {
    const auto& t = reinterpret_cast<const sockaddr_in&>(theirs);
    const auto& o = reinterpret_cast<const sockaddr_in&>(ours);
    SetDiagSocketId(&ask.request.id, t.sin_port, &t.sin_addr, o.sin_port, &o.sin_addr, 4);
  } else if (theirs.ss_family == AF_INET6) {
    const auto& t = reinterpret_cast<const sockaddr_in6&>(theirs);
    const auto& o = reinterpret_cast<const sockaddr_in6&>(ours);
    SetDiagSocketId(&ask.request.id, t.sin6_port, &t.sin6_addr, o.sin6_port, &o.sin6_addr, 16);
  } else {
    return InvalidArgument("not a TCP/IP connection");
  }
  const int nl = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return ErrnoStatus("socket(NETLINK_SOCK_DIAG)", errno);
  timeval wait{1, 0};  // the kernel answers at once; bound it all the same
  ::setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl, &ask, sizeof(ask), 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof(kernel)) != static_cast<ssize_t>(sizeof(ask))) {
    const int err = errno;
    ::close(nl);
    return ErrnoStatus("sock_diag request", err);
  }
  alignas(nlmsghdr) char buf[8192];
  ssize_t n;
  while ((n = ::recv(nl, buf, sizeof(buf), 0)) < 0 && errno == EINTR) {
  }
  const int err = errno;
  ::close(nl);
  if (n < 0) return ErrnoStatus("sock_diag answer", err);
  auto* answer = reinterpret_cast<nlmsghdr*>(buf);
  if (!NLMSG_OK(answer, static_cast<unsigned>(n))) return Internal("malformed sock_diag answer");
  if (answer->nlmsg_type == NLMSG_ERROR) {
    const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(answer));
    if (e->error == -ENOENT) return std::optional<uint32_t>();  // not a socket of this host
    return ErrnoStatus("sock_diag lookup", -e->error);
  }
  if (answer->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      answer->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return Internal("unexpected sock_diag answer (type {})", answer->nlmsg_type);
  }
  // The kernel's lookup falls back to a listening socket on the destination port, and a
  // socket in TIME_WAIT reports uid 0: only a connected socket with exactly the asked
  // four-tuple names the peer's owner. Anything else is not a socket of this host's that
  // can be trusted: the peer is treated as another host.
  const auto* msg = static_cast<const inet_diag_msg*>(NLMSG_DATA(answer));
  constexpr uint8_t kEstablished = 1;  // TCP_ESTABLISHED
  const auto& got = msg->id;
  const auto& want = ask.request.id;
  bool same = msg->idiag_state == kEstablished && got.idiag_sport == want.idiag_sport &&
              got.idiag_dport == want.idiag_dport;
  if (same && msg->idiag_family == ask.request.sdiag_family) {
    const size_t words = msg->idiag_family == AF_INET ? 1 : 4;
    same = std::equal(got.idiag_src, got.idiag_src + words, want.idiag_src) &&
           std::equal(got.idiag_dst, got.idiag_dst + words, want.idiag_dst);
  } else if (same && msg->idiag_family == AF_INET6 && ask.request.sdiag_family == AF_INET) {
    // An IPv6 socket connected to an IPv4 address: its addresses are v4-mapped.
    auto mapped = [](const uint32_t* a, uint32_t v4) {
      return a[0] == 0 && a[1] == 0 && a[2] == htonl(0xffff) && a[3] == v4;
    };
    same = mapped(got.idiag_src, want.idiag_src[0]) && mapped(got.idiag_dst, want.idiag_dst[0]);
  } else {
    same = false;
  }
  if (!same) return std::optional<uint32_t>();
  return std::optional<uint32_t>(msg->idiag_uid);
}

}  // namespace cohort::net
