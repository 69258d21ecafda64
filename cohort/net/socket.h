// POSIX TCP sockets with deadlines: listen on a port (0 = kernel-chosen), connect with a
// deadline and retry, send/receive exactly N bytes before a deadline.
//
// Thread-safety: a Socket is owned by one thread at a time; distinct sockets are
// independent. Move-only; the destructor closes the descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cohort/base/status.h"
#include "cohort/base/time.h"

namespace cohort::net {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.Release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Close();

  // Sends all of `data` or fails; kDeadlineExceeded when the deadline passes first.
  Status SendAll(const void* data, size_t size, Deadline deadline);
  // Receives exactly `size` bytes; kUnavailable on EOF ("peer closed the connection").
  Status RecvAll(void* data, size_t size, Deadline deadline);
  // Waits until readable; returns false on deadline.
  Result<bool> WaitReadable(Deadline deadline);

  // Local port of a bound socket.
  Result<int> LocalPort() const;
  // "ip:port" of the remote end, or "?" when unknown.
  std::string PeerName() const;

 private:
  int fd_ = -1;
};

struct ListenOptions {
  std::string host = "0.0.0.0";  // "" or "0.0.0.0" = all IPv4 interfaces
  int port = 0;                   // 0 = kernel-chosen
  int backlog = 4096;
  bool reuse_addr = true;
};

// Binds and listens; the socket is non-blocking and close-on-exec.
Result<Socket> Listen(const ListenOptions& options);

// Binds (without listening) to host:port with SO_REUSEADDR. Such a socket keeps the kernel
// from handing the port to other port-0 binds, while a process that sets SO_REUSEADDR can
// still bind and listen on it. Used to reserve MASTER_PORT for a job's lifetime.
Result<Socket> ReservePort(std::string_view host, int port);

// Connects to host:port, retrying refused connections with backoff until the deadline.
// The returned socket is blocking-mode-agnostic (all I/O goes through poll) and has
// TCP_NODELAY set.
Result<Socket> Connect(std::string_view host, int port, Deadline deadline);

// Resolves `host` to an IPv4 address string (numeric hosts pass through).
Result<std::string> ResolveIpv4(std::string_view host);
// True when `host` resolves to an address configured on this machine (or loopback).
bool IsLocalHost(std::string_view host);
// The user that owns the other end of the accepted TCP connection `fd` when that end is a
// socket of this host (this network namespace), found through the kernel's socket
// diagnostics (NETLINK_SOCK_DIAG, as `ss -e` shows it), when that socket is connected and
// has exactly this connection's addresses and ports; nullopt otherwise (the peer is another
// host, or its socket is already closing, or the kernel named a listener instead). An
// error when the kernel cannot be asked.
Result<std::optional<uint32_t>> LocalPeerUid(int fd);
// The hostname of this machine (uname nodename).
std::string HostName();

}  // namespace cohort::net
