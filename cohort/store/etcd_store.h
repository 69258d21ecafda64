// EtcdStore: the Store interface on an etcd v3 cluster, through etcd's JSON gateway over
// HTTP(S) with libcurl (see docs/etcd.md).
//
//  - Every key lives under "/cohort/<prefix>/"; NumKeys counts that prefix only.
//  - Set/Get/Check/Delete/NumKeys/MultiSet/MultiGet are KV range/put/deleterange/txn
//    requests; Add is read + txn(compare mod_revision) retried until it wins; CompareSet is
//    one txn (create_revision == 0 for an empty `expected`, else value == expected).
//  - Get/Wait/MultiGet block on a watch (POST /v3/watch, streaming) from the revision
//    after the read that found the key missing (etcd replays the puts since; Wait on one
//    key watches from now and reads once the watch is confirmed): woken by etcd, no polling.
//  - Idempotent writes of a join (the ticket txn, the record put) are sent again until the
//    caller's deadline when a request times out: an overloaded cluster slows joins down.
//  - Tickets are one key's versions (one txn per ticket, idempotent when retried); a Beat
//    is one txn (counter put if unchanged since this client's last beat, and the reads).
//  - Every request has a timeout (a cluster without quorum hangs requests): a non-blocking
//    call gives up after min(deadline, request_timeout) with kDeadlineExceeded. A member
//    that refuses, drops or stalls a request is skipped for the next endpoint within the
//    call's time (kUnavailable when every endpoint refused).
//  - Optional: TLS (https:// endpoints, CA file, client certificate), user/password auth
//    (token in the Authorization header, renewed when etcd calls it invalid), and a lease
//    kept alive by a background thread; keys written by Set/MultiSet are attached to it and
//    vanish when this client dies (liveness). The lease is revoked on destruction.
//
// Thread-safety: every method may be called from any thread concurrently; each call takes a
// kept-open connection (a CURL easy handle) from a small pool, a blocking call takes a second
// one for its watch. Abort() may be called from any thread: it shuts down the sockets of the
// calls in flight, so a blocked watch returns kCancelled at once.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/retry_budget.h"
#include "cohort/store/store.h"

namespace cohort::store {

struct EtcdStoreOptions {
  // "host:port" (http) or "http[s]://host:port"; tried in order, failing over on errors.
  std::vector<std::string> endpoints;
  std::string prefix = "default";  // keys live under "/cohort/<prefix>/"
  // The longest one non-blocking call may take, over all endpoints and retries.
  Duration request_timeout = std::chrono::seconds(5);
  // TLS: CA bundle to verify the members, client certificate and key (PEM).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // etcd authentication; empty user = none. The password and token are never logged.
  std::string user;
  std::string password;
  // When > 0: grant a lease with this TTL, keep it alive, attach keys written by Set to it.
  Duration lease_ttl = Duration::zero();
  // How many clients share the cluster at once (a job's nodes: --nnodes MAX). With many, a
  // join's ticket txn told "too many requests" waits in proportion (together they come back
  // at about kPacedRequestsPerSecond), and the retry budget saves less (RetryBudgetFor).
  int64_t peers = 1;
};

// The retries together of `peers` clients that etcd is given after it refused some: about
// what three members on modest machines apply in a second.
inline constexpr double kPacedRequestsPerSecond = 1000;

// The retry budget of one of `peers` clients: the ratio and the refill by time (0.5 a
// second) as for one; what it saves (10 tokens, spent at once in a burst) shared out beyond
// 100 peers, so that a burst of the cluster's clients together may not retry more at once
// than 100 of them alone would (at least one token each). The refill stays: a node whose
// requests etcd does not answer must still retry its beats within its dead timeout.
RetryBudget::Options RetryBudgetFor(double ratio, int64_t peers);

// Splits "h1:2379,h2:2379" (or URLs) into endpoint URLs: "http://h1:2379", or https:// when
// `tls`. A missing port is 2379.
Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view text, bool tls = false);

class EtcdStore final : public Store {
 public:
  // Reaches one member (authenticating and granting the lease when configured).
  static Result<std::unique_ptr<EtcdStore>> Connect(const EtcdStoreOptions& options,
                                                    Deadline deadline);
  ~EtcdStore() override;  // stops the keep-alive thread and revokes the lease

  COHORT_STORE_METHODS(override);  // the Store interface (store.h)
  // Tickets are the versions of the key "<key>/ticket": a ticket is one txn that puts it
  // and returns its previous version (no compare-and-swap retries however many callers
  // race, and O(1) for etcd); the count is the key's version. The txn also creates a
  // marker of this call, "<key>/t/<random>", so a txn sent again after a lost answer
  // takes no second ticket; the marker holds the ticket's record (Append), and the markers
  // by create revision are the records in ticket order (ReadAppended). An overloaded
  // cluster's timeouts make the txn be sent again until `deadline`, not fail the join.
  Result<int64_t> TakeTicket(std::string_view key, Deadline deadline) override;
  Result<int64_t> CountTickets(std::string_view key, Deadline deadline) override;
  Result<int64_t> Append(std::string_view ticket_key, std::string_view record_prefix,
                         std::string_view value, Deadline deadline) override;
  // Reads every marker of the key (pages of 1,000 in key order) and orders them.
  Result<std::vector<std::string>> ReadAppended(std::string_view ticket_key,
                                                std::string_view record_prefix, int64_t first,
                                                int64_t count, Deadline deadline) override;
  // Waits for the ticket key's version (one read, then a watch).
  Status WaitAppended(std::string_view ticket_key, std::string_view record_prefix,
                      int64_t ticket, Deadline deadline) override;
  // One txn: the ticket with its record unless an `unless` key exists, and the reads.
  Result<JoinResult> Join(const JoinRequest& request, Deadline deadline) override;
  // One watch from the revision after `*seen` (a Join's): no read first; gives back the
  // value's mod revision.
  Result<std::string> GetSince(std::string_view key, int64_t* seen, Deadline deadline) override;
  // One txn (increment the beat counter, read the peeked keys and the wait key), then a
  // watch when the wait key is missing; on a leased key (LeaseKey) a keep-alive and a
  // read-only txn instead. One wait key only, as the default; more peek keys
  // than one txn may hold go through the default (Add, Peek, Get).
  Result<BeatResult> Beat(std::string_view beat_key, const std::vector<std::string>& peek_keys,
                          const std::vector<std::string>& wait_keys, Deadline deadline) override;

  // Registers `key` for the client's key lease (no request; it replaces the key registered
  // before, which stays on the lease until the lease ends): the first Beat on it grants
  // the lease (once per client; again when `ttl` changes or etcd lost it) and puts the key
  // with it in the beat's txn; later beats renew the lease (POST /v3/lease/keepalive) and
  // read in a read-only txn. The lease is revoked on destruction (unless aborted).
  Status LeaseKey(std::string_view key, Duration ttl, Deadline deadline) override;

  // A pause that Abort() cuts short: no request.
  Status Idle(Deadline deadline) override;
  // One watch from the revision after `since`, held open across calls for the same key (a
  // call for another key, or from an earlier revision, opens a new one): a request per
  // watch, not per call. kFailedPrecondition when `since` is not a revision (<= 0).
  Result<std::optional<std::string>> Await(std::string_view key, int64_t since,
                                           Deadline deadline) override;

  // One keys-only read of the keys (a range from the smallest to the largest, as Peek's)
  // and their mod revisions against the revision an answer to this client carried
  // `quiet_for` ago (a key on a lease is not silent): kFailedPrecondition until this client
  // has an answer that old.
  Result<std::vector<bool>> Silent(const std::vector<std::string>& keys, Duration quiet_for,
                                   Deadline deadline) override;

  // One txn: every key absent -> put each; else a range of each, whose values are compared
  // with `values` (a txn applied whose answer was lost is found written: true).
  Result<bool> CreateAll(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values, Deadline deadline) override;

  // Deletes every key under this store's prefix (a finished job's keys); returns how many.
  Result<int64_t> DeleteAll(Deadline deadline);

  // The lease keys written by Set are attached to (0 when no lease_ttl).
  int64_t lease_id() const;
  // The endpoint the next request goes to first (the last one that answered).
  std::string endpoint() const;

  struct Impl;

 private:
  explicit EtcdStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::store
