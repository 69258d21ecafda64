// TorchStoreServer: a server of PyTorch's TCPStore wire protocol (as torch 1.13 speaks it:
// set, compare_set, get, add, check, wait, num_keys, delete_key), so that the agent can host
// the store that torch's env:// rendezvous uses. With TORCHELASTIC_USE_AGENT_STORE=True in
// the workers' environment every rank connects as a client to a server that is already
// listening: no rank races to start it, and no client sleeps a second before retrying.
// Keys live in memory for the server's lifetime (the agent starts one per round).
//
// Who may use it: torch's protocol has no authentication, so the server admits by who is
// at the other end, at accept: a process of this host only when it runs as this server's
// user (the kernel's socket diagnostics name the owner of the connecting socket), another
// host only when its address is one of `remote_hosts` (the round's nodes) or
// `any_remote_host` is set. Everything else is closed before a byte is read. Limits bound
// what an admitted client can take: a value, a request, the whole store and the number of
// connections. (No idle timeout: torch's client holds a second connection, for watchKey
// callbacks, that stays silent for the life of the process; strangers never get in.)
// Requests are parsed incrementally (a field is read once, however the bytes arrive).
//
// Thread-safety: Start/Stop/port/stats may be called from any thread; all state is owned by
// the server's event-loop thread ("torch-store").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::store {

struct TorchStoreServerOptions {
  // The address the job reaches it at (MASTER_ADDR); "0.0.0.0" only when asked for.
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port; SO_REUSEADDR, so a port held by net::ReservePort works
  std::vector<std::string> remote_hosts;  // other hosts admitted (IP addresses)
  bool any_remote_host = false;           // admit every other host (as torch's own store)
  size_t max_value_bytes = size_t{64} << 20;     // one key or value
  size_t max_request_bytes = size_t{128} << 20;  // one request, all its fields
  size_t max_store_bytes = size_t{1} << 30;      // keys and values held, all together
  int max_connections = 16384;
  // Keys the store holds from the start (the agent's round number, so that a worker that
  // reaches the port after the next round's store replaced this one can tell).
  std::vector<std::pair<std::string, std::string>> initial_keys;
};

struct TorchStoreServerStats {
  int64_t admitted = 0;
  int64_t refused = 0;        // closed at accept: not this user's, not a node of the job
  int64_t closed_for_limits = 0;  // over a limit, or a malformed or unsupported request
  int64_t open = 0;
  int64_t stored_bytes = 0;
};

class TorchStoreServer {
 public:
  static Result<std::unique_ptr<TorchStoreServer>> Start(const TorchStoreServerOptions& options);
  ~TorchStoreServer();
  TorchStoreServer(const TorchStoreServer&) = delete;
  TorchStoreServer& operator=(const TorchStoreServer&) = delete;

  int port() const;
  TorchStoreServerStats stats() const;
  void Stop();

 private:
  class Impl;
  explicit TorchStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::store
