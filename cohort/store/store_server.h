// StoreServer: the embedded store service (`cohort store`, or hosted inside `cohort run`).
// Serves the protocol in docs/store-protocol.md to many clients on one event-loop thread
// ("store-server"). Blocked GET/WAIT/MULTI_GET requests are parked on the keys they wait
// for and answered when a writer sets them (push) or when their timeout fires. A client
// may leave a will (WILL): a key the server sets, saying why, when that client's
// connection ends and the client does not take the will up again within its grace.
//
// Robustness: a client must open with HELLO carrying the job's token; a wrong or missing
// token, a malformed frame or an oversized frame closes that client's connection with a
// logged reason (never the token) and does not disturb other clients. Before HELLO a
// client may send at most kMaxHelloFrame bytes, must authenticate within
// handshake_timeout, and at most max_unauthenticated such connections are open at once
// (when all are held, a new connection sheds one of them at random, so strangers cannot
// lock the job's clients out): a stranger cannot make the server allocate memory or hold
// its descriptors. A refused HELLO ends the connection; nothing pipelined after it counts. A client
// that stops reading its responses is disconnected once max_output_bytes are queued.
//
// Thread-safety: Start/Stop/port/stats may be called from any thread; all store state is
// owned by the event-loop thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/store/protocol.h"

namespace cohort::store {

struct StoreServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0 = kernel-chosen; read it back with port()
  std::string token;
  uint32_t max_frame = protocol::kDefaultMaxFrame;  // after HELLO
  Duration handshake_timeout = std::chrono::seconds(10);
  int max_unauthenticated = 512;
  size_t max_output_bytes = size_t{2} * protocol::kDefaultMaxFrame;
};

struct StoreServerStats {
  int64_t connections_accepted = 0;
  int64_t connections_rejected = 0;  // bad token, malformed or oversized frames
  int64_t connections_open = 0;
  int64_t connections_unauthenticated = 0;  // open, HELLO not yet accepted
  int64_t requests = 0;
  int64_t beats = 0;  // of which BEAT (rendezvous heartbeats)
  int64_t wills_fired = 0;  // wills whose key the server set (a connection ended for good)
};

class StoreServer {
 public:
  static Result<std::unique_ptr<StoreServer>> Start(const StoreServerOptions& options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  StoreServerStats stats() const;
  // Closes every connection and joins the event-loop thread. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Raises this process's open-file soft limit to its hard limit (for many connections).
void RaiseFileLimit();

}  // namespace cohort::store
