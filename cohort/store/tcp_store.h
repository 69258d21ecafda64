// TcpStore: the client of StoreServer (see docs/store-protocol.md). One TCP connection,
// opened with a HELLO carrying the job's token. Blocking calls (Get, Wait, MultiGet) send
// their remaining time to the server, which holds the request and answers when the keys
// appear (a push) or the time is up; the client never polls.
//
// A broken connection is reopened on the next call (within that call's deadline). A
// response that arrives after its call gave up is recognised by its request id and dropped.
//
// Thread-safety: calls are serialized by mu_ (one request in flight per connection), which
// guards the socket, the request ids and reached_peer_; Abort() may be called from any
// thread and unblocks a call in progress (it touches only atomics).
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/net/socket.h"
#include "cohort/store/protocol.h"
#include "cohort/store/store.h"

namespace cohort::net {
class Writer;  // cohort/net/codec.h
}  // namespace cohort::net

namespace cohort::store {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string token;  // the job's token; never logged
  uint32_t max_frame = protocol::kDefaultMaxFrame;
};

// What answers at a store endpoint (TcpStore::Probe).
enum class StorePeer {
  kCohortStore,     // a cohort store that took the token
  kWrongToken,      // a cohort store of another job (it refused the token)
  kOtherProgram,    // something accepted the connection but did not speak the protocol
  kNothing,         // nothing accepted the connection before the deadline
};

class TcpStore final : public Store {
 public:
  // Connects and completes the handshake before `deadline`.
  static Result<std::unique_ptr<TcpStore>> Connect(const TcpStoreOptions& options,
                                                   Deadline deadline);
  // Who is at the endpoint, and, when it is not this job's store, the error that says so.
  struct ProbeResult {
    StorePeer peer;
    Status status;
  };
  static ProbeResult Probe(const TcpStoreOptions& options, Deadline deadline);
  ~TcpStore() override;

  COHORT_STORE_METHODS(override);  // the Store interface (store.h)
  // In one request (CREATE_ALL), applied by the server in one step.
  Result<bool> CreateAll(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values, Deadline deadline) override;
  Result<BeatResult> Beat(std::string_view beat_key, const std::vector<std::string>& peek_keys,
                          const std::vector<std::string>& wait_keys, Deadline deadline) override;
  // Leaves the will on this connection, and again on every connection this client opens
  // later (a reconnection within the grace takes the will up: it does not fire).
  Status LeaveWill(std::string_view key, Duration grace, Deadline deadline) override;
  Result<int64_t> Append(std::string_view ticket_key, std::string_view record_prefix,
                         std::string_view value, Deadline deadline) override;
  Status Ping(Deadline deadline);

  std::string endpoint() const;

 private:
  explicit TcpStore(TcpStoreOptions options) : options_(std::move(options)) {}
  class Call;  // holds mu_ for one request (a scoped capability)
  Status EnsureConnected(Deadline deadline) COHORT_REQUIRES(mu_);
  Status SetupCall(protocol::Op op, Deadline deadline,
                   const std::function<void(net::Writer&)>& fields) COHORT_REQUIRES(mu_);
  // Sends the request in `frame` (whose id is `id`) and reads its response body into `body`.
  Status RoundTrip(std::string& frame, uint64_t id, std::string* body, Deadline deadline)
      COHORT_REQUIRES(mu_);
  Status ReadAnswer(std::string* body, Deadline deadline) COHORT_REQUIRES(mu_);

  const TcpStoreOptions options_;
  Mutex mu_;  // serializes calls
  net::Socket socket_ COHORT_GUARDED_BY(mu_);
  uint64_t next_id_ COHORT_GUARDED_BY(mu_) = 1;
  std::string received_ COHORT_GUARDED_BY(mu_);  // bytes read past the last answer
  std::atomic<bool> aborted_{false};
  std::atomic<int> live_fd_{-1};  // for Abort() from another thread
  // The last EnsureConnected got a TCP connection.
  bool reached_peer_ COHORT_GUARDED_BY(mu_) = false;
  // The wills left (key, grace), left again after each reconnection.
  std::vector<std::pair<std::string, Duration>> wills_ COHORT_GUARDED_BY(mu_);
};

}  // namespace cohort::store
