// Implements RoundTell (round_tell.h): the datagram socket, its wait and its sends.
// Thread-safety: see round_tell.h; this file keeps no global state.
#include "cohort/rendezvous/round_tell.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <vector>

#include "cohort/base/strings.h"
#include "cohort/net/socket.h"

namespace cohort::rendezvous {

namespace {

constexpr std::string_view kMagic = "cohort-end 1";

// Equal texts, in time that does not depend on where they differ (the key).
bool SameKey(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The next line of `text` from `*at` (without its newline); nullopt when none is left.
std::optional<std::string_view> NextLine(std::string_view text, size_t* at) {
  if (*at > text.size()) return std::nullopt;
  const size_t newline = text.find('\n', *at);
  if (newline == std::string_view::npos) return std::nullopt;
  std::string_view line = text.substr(*at, newline - *at);
  *at = newline + 1;
  return line;
}

}  // namespace

std::string EncodeToldEnd(std::string_view run_id, int64_t round, std::string_view key,
                          std::string_view end) {
  return fmt::format("{}\n{}\n{}\n{}\n{}", kMagic, run_id, round, key, end);
}

std::optional<std::string> DecodeToldEnd(std::string_view datagram, std::string_view run_id,
                                         int64_t round, std::string_view key) {
  size_t at = 0;
  auto magic = NextLine(datagram, &at);
  auto job = NextLine(datagram, &at);
  auto number = NextLine(datagram, &at);
  auto told_key = NextLine(datagram, &at);
  if (!told_key || *magic != kMagic || *job != run_id) return std::nullopt;
  auto told_round = ParseInt64(*number);
  if (!told_round || *told_round != round || key.empty() || !SameKey(*told_key, key)) {
    return std::nullopt;
  }
  return std::string(datagram.substr(at));
}

Result<std::shared_ptr<RoundTell>> RoundTell::Open() {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal("cannot open the round's datagram socket: {}", strerror(errno));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(at);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof(at)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return Internal("cannot bind the round's datagram socket: {}", strerror(err));
  }
  return std::shared_ptr<RoundTell>(new RoundTell(fd, ntohs(at.sin_port)));
}

RoundTell::~RoundTell() { ::close(fd_); }

Result<std::optional<std::string>> RoundTell::Await(std::string_view run_id, int64_t round,
                                                    std::string_view key, Deadline deadline) {
  std::string buffer;  // made when a datagram comes (most waits end without one)
  for (;;) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {cancel_.fd(), POLLIN, 0}};
    const int n = ::poll(fds, 2, deadline.PollTimeoutMs());
    if (n < 0 && errno != EINTR) return Internal("poll: {}", strerror(errno));
    if (cancel_.Readable()) return Cancelled("the round's wait was cancelled");
    if (n > 0 && (fds[0].revents & POLLIN) != 0) {
      // Every datagram queued: stale ends (of rounds before) are dropped here.
      buffer.resize(65536);
      for (;;) {
        const ssize_t got = ::recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (got < 0) break;
        auto end = DecodeToldEnd(std::string_view(buffer.data(), static_cast<size_t>(got)),
                                 run_id, round, key);
        if (end) return std::optional<std::string>(std::move(end));
      }
    }
    if (deadline.expired()) return std::optional<std::string>();
  }
}

int RoundTell::Send(std::string_view run_id, int64_t round, std::string_view key,
                    std::string_view end, const std::vector<Peer>& to) {
  std::string datagram = EncodeToldEnd(run_id, round, key, end);
  if (datagram.size() > kMaxDatagram || key.empty()) return 0;
  std::map<std::string, std::optional<in_addr>, std::less<>> resolved;  // per address, once
  std::vector<sockaddr_in> dests;
  dests.reserve(to.size());
  for (const Peer& peer : to) {
    if (peer.port <= 0 || peer.port > 65535) continue;
    auto [it, fresh] = resolved.try_emplace(peer.addr);
    if (fresh) {
      auto ip = net::ResolveIpv4(peer.addr);
      in_addr a{};
      if (ip.ok() && ::inet_pton(AF_INET, ip->c_str(), &a) == 1) it->second = a;
    }
    if (!it->second) continue;
    sockaddr_in dest{};
    dest.sin_family = AF_INET;
    dest.sin_port = htons(static_cast<uint16_t>(peer.port));
    dest.sin_addr = *it->second;
    dests.push_back(dest);
  }
  // Up to 256 datagrams per system call (sendmmsg), all of the same text.
  iovec text{datagram.data(), datagram.size()};
  std::vector<mmsghdr> batch(std::min<size_t>(dests.size(), 256));
  int sent = 0;
  for (size_t at = 0; at < dests.size();) {
    const size_t n = std::min(batch.size(), dests.size() - at);
    for (size_t i = 0; i < n; ++i) {
      batch[i] = mmsghdr{};
      batch[i].msg_hdr.msg_name = &dests[at + i];
      batch[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
      batch[i].msg_hdr.msg_iov = &text;
      batch[i].msg_hdr.msg_iovlen = 1;
    }
    const int done = ::sendmmsg(fd_, batch.data(), static_cast<unsigned>(n), MSG_NOSIGNAL);
    if (done < 0 && errno == EINTR) continue;
    // A datagram the kernel refuses is skipped (that node learns the end at its beat).
    at += done > 0 ? static_cast<size_t>(done) : 1;
    if (done > 0) sent += done;
  }
  return sent;
}

}  // namespace cohort::rendezvous
