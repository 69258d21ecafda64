// Implements TcpMesh. Thread-safety: see tcp_mesh.h.
#include "cohort/comm/transport/tcp/tcp_mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <cerrno>
#include <cstring>

#include "cohort/base/strings.h"
#include "cohort/net/codec.h"

namespace cohort::comm {
namespace {

constexpr uint32_t kHelloMagic = 0x636f6d6d;  // "comm"

struct WireHeader {
  OpDesc desc;
  uint64_t bytes;
};
static_assert(sizeof(WireHeader) == 32);

Status Mismatch(int me, const OpDesc& mine, int peer, const OpDesc& theirs) {
  return FailedPrecondition(
      "collective mismatch: rank {} is in {} but rank {} is in {}; every rank must issue the "
      "same collectives in the same order",
      me, mine.ToString(), peer, theirs.ToString());
}

}  // namespace

Result<std::unique_ptr<TcpMesh>> TcpMesh::Create(store::Store& store, const std::string& prefix,
                                                 int rank, int size,
                                                 const std::string& listen_addr,
                                                 Deadline deadline) {
  std::unique_ptr<TcpMesh> mesh(new TcpMesh(rank, size));
  if (size == 1) return mesh;
  // Step 1.
  COHORT_ASSIGN_OR_RETURN(net::Socket listener, net::Listen({.host = "0.0.0.0", .port = 0}));
  COHORT_ASSIGN_OR_RETURN(int port, listener.LocalPort());
  const std::string nonce = RandomHex(8);
  COHORT_RETURN_IF_ERROR(store.Set(fmt::format("{}/tcp/{}", prefix, rank),
                                   fmt::format("{}:{}/{}", listen_addr, port, nonce), deadline));
  // Step 2.
  for (int peer = 0; peer < rank; ++peer) {
    COHORT_ASSIGN_OR_RETURN(std::string record,
                            store.Get(fmt::format("{}/tcp/{}", prefix, peer), deadline));
    size_t slash = record.rfind('/');
    auto hp = ParseHostPort(record.substr(0, slash), 0);
    if (slash == std::string::npos || !hp) return DataLoss("bad mesh record of rank {}", peer);
    auto sock = net::Connect(hp->first, hp->second, deadline);
    if (!sock.ok()) return sock.status().WithContext(fmt::format("connecting to rank {}", peer));
    net::Writer hello;
    hello.U32(kHelloMagic).U32(static_cast<uint32_t>(rank)).Str(record.substr(slash + 1));
    auto& frame = hello.Finish();
    COHORT_RETURN_IF_ERROR(sock->SendAll(frame.data(), frame.size(), deadline));
    mesh->peers_[peer] = std::move(sock).value();
  }
  // Step 3.
  for (int accepted = 0; accepted < size - 1 - rank;) {
    COHORT_ASSIGN_OR_RETURN(bool ready, listener.WaitReadable(deadline));
    if (!ready) {
      return DeadlineExceeded("rank {}: {} higher rank(s) never connected to the mesh", rank,
                              size - 1 - rank - accepted);
    }
    net::Socket sock(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!sock.valid()) continue;
    std::string body;
    if (!net::ReadFrame(sock, &body, 256, deadline).ok()) continue;
    net::Reader r(body);
    uint32_t magic, peer;
    std::string got;
    if (!r.U32(&magic) || !r.U32(&peer) || !r.Str(&got) || magic != kHelloMagic ||
        static_cast<int>(peer) <= rank || static_cast<int>(peer) >= size || got != nonce ||
        mesh->peers_[peer].valid()) {
      continue;  // not one of ours: drop the connection
    }
    int one = 1;
    ::setsockopt(sock.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    mesh->peers_[peer] = std::move(sock);
    ++accepted;
  }
  return mesh;
}

TcpMesh::~TcpMesh() = default;

void TcpMesh::Abort() {
  for (auto& s : peers_) {
    if (s.valid()) ::shutdown(s.fd(), SHUT_RDWR);
  }
}

Status TcpMesh::SendRecv(int to, const void* sbuf, size_t ssize, int from, void* rbuf,
                         size_t rsize, const OpDesc& desc, Deadline deadline) {
  return Transfer(to, sbuf, ssize, from, rbuf, rsize, 1, nullptr, desc, deadline);
}

Status TcpMesh::SendRecvStream(int to, const void* sbuf, size_t ssize, int from, size_t rsize,
                               size_t align, const Consumer& consume, const OpDesc& desc,
                               Deadline deadline) {
  constexpr size_t kStageBytes = 1u << 20;
  if (stage_.size() < kStageBytes) stage_.resize(kStageBytes);
  return Transfer(to, sbuf, ssize, from, nullptr, rsize, std::max<size_t>(align, 1), &consume,
                  desc, deadline);
}

// One loop for both: send and receive progress alternate without blocking; poll only when
// neither side can move. With a consumer, payload lands in stage_ and is handed over in
// aligned pieces right after each read.
Status TcpMesh::Transfer(int to, const void* sbuf, size_t ssize, int from, void* rbuf,
                         size_t rsize, size_t align, const Consumer* consume,
                         const OpDesc& desc, Deadline deadline) {
  size_t staged = 0, delivered = 0;
  WireHeader out_header{desc, ssize};
  WireHeader in_header{};
  // Progress of each direction over [header][payload].
  size_t sent = to >= 0 ? 0 : SIZE_MAX, received = from >= 0 ? 0 : SIZE_MAX;
  const size_t send_total = sizeof(WireHeader) + ssize;
  const size_t recv_total = sizeof(WireHeader) + rsize;
  const int sfd = to >= 0 ? peers_[to].fd() : -1;
  const int rfd = from >= 0 ? peers_[from].fd() : -1;
  bool header_checked = false;

  auto do_send = [&]() -> Status {
    while (sent < send_total) {
      iovec iov[2];
      int n = 0;
      if (sent < sizeof(WireHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&out_header) + sent, sizeof(WireHeader) - sent};
        if (ssize) iov[n++] = {const_cast<void*>(sbuf), ssize};
      } else {
        size_t off = sent - sizeof(WireHeader);
        iov[n++] = {static_cast<char*>(const_cast<void*>(sbuf)) + off, ssize - off};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      ssize_t k = ::sendmsg(sfd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::Ok();
      return Unavailable("{}: sending to rank {} failed: {} (did it exit or crash?)",
                         desc.ToString(), to, std::strerror(errno));
    }
    return Status::Ok();
  };
  auto do_recv = [&]() -> Status {
    while (received < recv_total) {
      iovec iov[2];
      int n = 0;
      if (received < sizeof(WireHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&in_header) + received,
                    sizeof(WireHeader) - received};
        // Read the payload in the same call only once the header is known to match.
      } else if (consume == nullptr) {
        size_t off = received - sizeof(WireHeader);
        iov[n++] = {static_cast<char*>(rbuf) + off, rsize - off};
      } else {
        size_t left = rsize - (received - sizeof(WireHeader));
        iov[n++] = {stage_.data() + staged, std::min(stage_.size() - staged, left)};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      ssize_t k = ::recvmsg(rfd, &msg, MSG_DONTWAIT);
      if (k > 0) {
        const bool payload = received >= sizeof(WireHeader);
        received += static_cast<size_t>(k);
        if (consume != nullptr && payload) {
          staged += static_cast<size_t>(k);
          size_t give = received >= recv_total ? staged : staged / align * align;
          if (give > 0) {
            (*consume)(delivered, stage_.data(), give);
            delivered += give;
            std::memmove(stage_.data(), stage_.data() + give, staged - give);
            staged -= give;
          }
          return Status::Ok();  // let the sender run before reading more
        }
        if (!header_checked && received >= sizeof(WireHeader)) {
          header_checked = true;
          if (!(in_header.desc == desc)) return Mismatch(rank_, desc, from, in_header.desc);
          if (in_header.bytes != rsize) {
            return FailedPrecondition(
                "collective mismatch in {}: rank {} sent {} bytes, rank {} expected {}",
                desc.ToString(), from, in_header.bytes, rank_, rsize);
          }
        }
        continue;
      }
      if (k == 0) {
        return Unavailable("{}: rank {} closed its connection (did it exit or crash?)",
                           desc.ToString(), from);
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      return Unavailable("{}: receiving from rank {} failed: {}", desc.ToString(), from,
                         std::strerror(errno));
    }
    return Status::Ok();
  };

  for (;;) {
    const size_t sent_before = sent, received_before = received;
    if (to >= 0) COHORT_RETURN_IF_ERROR(do_send());
    if (from >= 0) COHORT_RETURN_IF_ERROR(do_recv());
    bool send_done = to < 0 || sent >= send_total;
    bool recv_done = from < 0 || received >= recv_total;
    if (send_done && recv_done) return Status::Ok();
    if (sent != sent_before || received != received_before) continue;  // progress: no poll
    pollfd fds[2];
    int n = 0;
    if (!send_done && !recv_done && sfd == rfd) {
      fds[n++] = {sfd, POLLOUT | POLLIN, 0};
    } else {
      if (!send_done) fds[n++] = {sfd, POLLOUT, 0};
      if (!recv_done) fds[n++] = {rfd, POLLIN, 0};
    }
    int rc = ::poll(fds, n, deadline.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
    if (rc == 0 && deadline.expired()) {
      std::string waiting;
      if (!recv_done) waiting = fmt::format("rank {} (received {} of {} bytes)", from,
                                            received, recv_total);
      if (!send_done) {
        waiting += fmt::format("{}rank {} to accept data (sent {} of {} bytes)",
                               waiting.empty() ? "" : " and ", to, sent, send_total);
      }
      return DeadlineExceeded("{}: timed out waiting for {}", desc.ToString(), waiting);
    }
  }
}

}  // namespace cohort::comm
