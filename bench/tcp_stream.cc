// tcp_stream: one-directional TCP stream throughput between two hosts, the reference for
// the TCP collective benchmark (bench/netns_tcp_bench.sh).
//   tcp_stream server PORT            accepts one connection, reads until EOF, prints GB/s
//   tcp_stream client HOST PORT BYTES sends BYTES, prints GB/s (GB = 1e9)
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cohort/net/socket.h"

using namespace cohort;

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "server") {
    auto listener = net::Listen({.host = "0.0.0.0", .port = std::atoi(argv[2])});
    if (!listener.ok()) {
      std::fprintf(stderr, "%s\n", listener.status().ToString().c_str());
      return 1;
    }
    std::printf("listening\n");
    std::fflush(stdout);
    if (!*listener->WaitReadable(Deadline::AfterMs(60000))) return 2;
    net::Socket conn(::accept4(listener->fd(), nullptr, nullptr, SOCK_CLOEXEC));
    std::vector<char> buf(4 << 20);
    size_t total = 0;
    auto start = SteadyClock::now();
    for (;;) {
      ssize_t n = ::recv(conn.fd(), buf.data(), buf.size(), 0);
      if (n <= 0) break;
      total += static_cast<size_t>(n);
    }
    double s = SecondsSince(start);
    std::printf("received %zu bytes in %.3f s: %.3f GB/s\n", total, s, total / s / 1e9);
    return 0;
  }
  if (argc >= 5 && std::string(argv[1]) == "client") {
    size_t bytes = std::strtoull(argv[4], nullptr, 10);
    auto sock = net::Connect(argv[2], std::atoi(argv[3]), Deadline::AfterMs(30000));
    if (!sock.ok()) {
      std::fprintf(stderr, "%s\n", sock.status().ToString().c_str());
      return 1;
    }
    std::vector<char> buf(4 << 20, 'x');
    auto start = SteadyClock::now();
    size_t sent = 0;
    while (sent < bytes) {
      size_t n = std::min(buf.size(), bytes - sent);
      if (!sock->SendAll(buf.data(), n, Deadline::AfterMs(60000)).ok()) return 3;
      sent += n;
    }
    ::shutdown(sock->fd(), SHUT_WR);
    char byte;
    while (::recv(sock->fd(), &byte, 1, 0) > 0) {
    }
    double s = SecondsSince(start);
    std::printf("sent %zu bytes in %.3f s: %.3f GB/s\n", sent, s, sent / s / 1e9);
    return 0;
  }
  std::fprintf(stderr, "usage: tcp_stream server PORT | client HOST PORT BYTES\n");
  return 2;
}
