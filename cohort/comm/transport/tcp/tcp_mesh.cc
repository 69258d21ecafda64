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
    mesh->where_[peer] = hp->first;
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
    const std::string from = sock.PeerName();
    mesh->where_[peer] = from.substr(0, from.rfind(':'));
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

namespace {

// One send and one receive of a Transfer, each over [header][payload], progressed without
// blocking. With a consumer, the payload lands in `stage` and is handed over in aligned
// pieces right after each read. Lives on the calling thread's stack for one call.
class Exchange {
 public:
  struct Side {
    int peer = -1;  // -1: this direction is unused
    int fd = -1;
    size_t bytes = 0;
    std::string_view where;  // the peer's host, for errors
  };
  Exchange(int rank, const OpDesc& desc, Side send, const void* sbuf, Side recv, void* rbuf,
           size_t align, const TcpMesh::Consumer* consume, std::vector<char>& stage)
      : rank_(rank), desc_(desc), send_(send), recv_(recv), sbuf_(sbuf), rbuf_(rbuf),
        align_(align), consume_(consume), stage_(stage), out_header_{desc, send.bytes},
        sent_(send.peer >= 0 ? 0 : SIZE_MAX), received_(recv.peer >= 0 ? 0 : SIZE_MAX),
        send_total_(sizeof(WireHeader) + send.bytes),
        recv_total_(sizeof(WireHeader) + recv.bytes) {}

  // Alternates send and receive progress; polls only when neither side can move.
  Status Run(Deadline deadline) {
    for (;;) {
      const size_t sent_before = sent_, received_before = received_;
      if (send_.peer >= 0) COHORT_RETURN_IF_ERROR(Send());
      if (recv_.peer >= 0) COHORT_RETURN_IF_ERROR(Receive());
      const bool send_done = send_.peer < 0 || sent_ >= send_total_;
      const bool recv_done = recv_.peer < 0 || received_ >= recv_total_;
      if (send_done && recv_done) return Status::Ok();
      if (sent_ != sent_before || received_ != received_before) continue;  // progress
      pollfd fds[2];
      int n = 0;
      if (!send_done && !recv_done && send_.fd == recv_.fd) {
        fds[n++] = {send_.fd, POLLOUT | POLLIN, 0};
      } else {
        if (!send_done) fds[n++] = {send_.fd, POLLOUT, 0};
        if (!recv_done) fds[n++] = {recv_.fd, POLLIN, 0};
      }
      int rc = ::poll(fds, n, deadline.PollTimeoutMs());
      if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
      if (rc == 0 && deadline.expired()) return TimedOut(send_done, recv_done);
    }
  }

 private:
  Status Send() {
    while (sent_ < send_total_) {
      iovec iov[2];
      int n = 0;
      if (sent_ < sizeof(WireHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&out_header_) + sent_, sizeof(WireHeader) - sent_};
        if (send_.bytes) iov[n++] = {const_cast<void*>(sbuf_), send_.bytes};
      } else {
        size_t off = sent_ - sizeof(WireHeader);
        iov[n++] = {static_cast<char*>(const_cast<void*>(sbuf_)) + off, send_.bytes - off};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      ssize_t k = ::sendmsg(send_.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        sent_ += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::Ok();
      return Unavailable("{}: sending to rank {} (at {}) failed: {} (did it exit or crash?)",
                         desc_.ToString(), send_.peer, send_.where, std::strerror(errno));
    }
    return Status::Ok();
  }

  Status Receive() {
    while (received_ < recv_total_) {
      iovec iov[2];
      int n = 0;
      if (received_ < sizeof(WireHeader)) {
        // The payload is read in the same call only once the header is known to match.
        iov[n++] = {reinterpret_cast<char*>(&in_header_) + received_,
                    sizeof(WireHeader) - received_};
      } else if (consume_ == nullptr) {
        size_t off = received_ - sizeof(WireHeader);
        iov[n++] = {static_cast<char*>(rbuf_) + off, recv_.bytes - off};
      } else {
        size_t left = recv_.bytes - (received_ - sizeof(WireHeader));
        iov[n++] = {stage_.data() + staged_, std::min(stage_.size() - staged_, left)};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      ssize_t k = ::recvmsg(recv_.fd, &msg, MSG_DONTWAIT);
      if (k > 0) {
        const bool payload = received_ >= sizeof(WireHeader);
        received_ += static_cast<size_t>(k);
        if (consume_ != nullptr && payload) {
          Deliver(static_cast<size_t>(k));
          return Status::Ok();  // let the sender run before reading more
        }
        if (!header_checked_ && received_ >= sizeof(WireHeader)) {
          header_checked_ = true;
          COHORT_RETURN_IF_ERROR(CheckHeader());
        }
        continue;
      }
      if (k == 0) {
        // "rank N (at ADDR)": the agent reads the lost peer from it (LostPeerIn).
        return Unavailable("{}: rank {} (at {}) closed its connection (did it exit or crash?)",
                           desc_.ToString(), recv_.peer, recv_.where);
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      return Unavailable("{}: receiving from rank {} (at {}) failed: {}", desc_.ToString(),
                         recv_.peer, recv_.where, std::strerror(errno));
    }
    return Status::Ok();
  }

  // Hands the consumer every whole aligned piece staged so far (all of it at the end).
  void Deliver(size_t just_read) {
    staged_ += just_read;
    size_t give = received_ >= recv_total_ ? staged_ : staged_ / align_ * align_;
    if (give == 0) return;
    (*consume_)(delivered_, stage_.data(), give);
    delivered_ += give;
    std::memmove(stage_.data(), stage_.data() + give, staged_ - give);
    staged_ -= give;
  }

  Status CheckHeader() const {
    if (!(in_header_.desc == desc_)) return Mismatch(rank_, desc_, recv_.peer, in_header_.desc);
    if (in_header_.bytes != recv_.bytes) {
      return FailedPrecondition(
          "collective mismatch in {}: rank {} sent {} bytes, rank {} expected {}",
          desc_.ToString(), recv_.peer, in_header_.bytes, rank_, recv_.bytes);
    }
    return Status::Ok();
  }

  Status TimedOut(bool send_done, bool recv_done) const {
    std::string waiting;
    if (!recv_done) {
      waiting = fmt::format("rank {} (received {} of {} bytes)", recv_.peer, received_,
                            recv_total_);
    }
    if (!send_done) {
      waiting += fmt::format("{}rank {} to accept data (sent {} of {} bytes)",
                             waiting.empty() ? "" : " and ", send_.peer, sent_, send_total_);
    }
    return DeadlineExceeded("{}: timed out waiting for {}", desc_.ToString(), waiting);
  }

  const int rank_;
  const OpDesc& desc_;
  const Side send_, recv_;
  const void* sbuf_;
  void* rbuf_;
  const size_t align_;
  const TcpMesh::Consumer* consume_;
  std::vector<char>& stage_;
  WireHeader out_header_;
  WireHeader in_header_{};
  size_t sent_, received_;  // progress of each direction over [header][payload]
  const size_t send_total_, recv_total_;
  size_t staged_ = 0, delivered_ = 0;
  bool header_checked_ = false;
};

}  // namespace

Status TcpMesh::Transfer(int to, const void* sbuf, size_t ssize, int from, void* rbuf,
                         size_t rsize, size_t align, const Consumer* consume,
                         const OpDesc& desc, Deadline deadline) {
  const Exchange::Side send{to, to >= 0 ? peers_[to].fd() : -1, ssize,
                            to >= 0 ? std::string_view(where_[to]) : std::string_view()};
  const Exchange::Side recv{from, from >= 0 ? peers_[from].fd() : -1, rsize,
                            from >= 0 ? std::string_view(where_[from]) : std::string_view()};
  return Exchange(rank_, desc, send, sbuf, recv, rbuf, align, consume, stage_).Run(deadline);
}

}  // namespace cohort::comm
