// Store: the key-value service that rendezvous, agents and workers coordinate through.
//
// Semantics shared by every implementation (MemoryStore, FileStore, PrefixStore, TcpStore):
//  - Get blocks until the key exists or the deadline passes (kDeadlineExceeded).
//  - Add treats the value as a decimal int64 (missing = 0) and returns the new value.
//  - CompareSet sets `desired` when the current value equals `expected` (a missing key
//    matches an empty `expected`) and returns the value the key holds afterwards.
//  - Wait blocks until every key exists; MultiGet is Wait + Get of each key in one call.
//  - Abort() makes every pending and later blocking call return kCancelled.
// Every call takes a deadline. Waits are woken by the writer (or pushed by the server),
// never by polling.
//
// Thread-safety: every implementation is safe to call from several threads; calls on one
// TcpStore are serialized on its connection (open another TcpStore for a blocking watch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <optional>
#include <string_view>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"

namespace cohort::store {

class Store {
 public:
  virtual ~Store() = default;

  virtual Status Set(std::string_view key, std::string_view value, Deadline deadline) = 0;
  virtual Result<std::string> Get(std::string_view key, Deadline deadline) = 0;
  virtual Result<int64_t> Add(std::string_view key, int64_t delta, Deadline deadline) = 0;
  virtual Result<std::string> CompareSet(std::string_view key, std::string_view expected,
                                         std::string_view desired, Deadline deadline) = 0;
  virtual Status Wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  virtual Result<bool> Check(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Reads several keys at one moment without waiting: nullopt for a key that is absent.
  virtual Result<std::vector<std::optional<std::string>>> Peek(
      const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Returns whether the key existed.
  virtual Result<bool> Delete(std::string_view key, Deadline deadline) = 0;
  virtual Result<int64_t> NumKeys(Deadline deadline) = 0;
  virtual Result<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                                    Deadline deadline) = 0;
  virtual Status MultiSet(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values, Deadline deadline) = 0;
  virtual void Abort() = 0;

  // Tickets: TakeTicket(key) gives each caller its position 1, 2, 3, ... among the callers
  // for `key`; CountTickets(key) says how many were taken. The default is Add(key, 1) and
  // Add(key, 0). A store without an atomic increment (etcd) overrides both with a scheme
  // in which callers do not race one compare-and-swap (rendezvous joins use these).
  virtual Result<int64_t> TakeTicket(std::string_view key, Deadline deadline) {
    return Add(key, 1, deadline);
  }
  virtual Result<int64_t> CountTickets(std::string_view key, Deadline deadline) {
    return Add(key, 0, deadline);
  }
  // Takes a ticket for `ticket_key` (as TakeTicket) and stores `value` as that ticket's
  // record (ReadAppended, WaitAppended); returns the ticket. The default is TakeTicket then
  // Set of `record_prefix` followed by the ticket ("r3/node" and ticket 17: "r3/node17");
  // TcpStore does both in one round trip (APPEND), EtcdStore in one txn that keeps the
  // record with the ticket, so that joining a rendezvous round costs one request, not two.
  virtual Result<int64_t> Append(std::string_view ticket_key, std::string_view record_prefix,
                                 std::string_view value, Deadline deadline) {
    COHORT_ASSIGN_OR_RETURN(int64_t ticket, TakeTicket(ticket_key, deadline));
    COHORT_RETURN_IF_ERROR(Set(std::string(record_prefix) + std::to_string(ticket), value,
                               deadline));
    return ticket;
  }

  // The records Append stored: those of tickets first..first+count-1 of `ticket_key`, in
  // ticket order, waiting until each exists (kDeadlineExceeded when one does not by
  // `deadline`). Where a record lives is the store's business: the default reads
  // `record_prefix` + ticket (MultiGet); EtcdStore keeps it with the ticket.
  virtual Result<std::vector<std::string>> ReadAppended(std::string_view ticket_key,
                                                        std::string_view record_prefix,
                                                        int64_t first, int64_t count,
                                                        Deadline deadline) {
    (void)ticket_key;
    std::vector<std::string> keys;
    keys.reserve(static_cast<size_t>(std::max<int64_t>(count, 0)));
    for (int64_t t = first; t < first + count; ++t) {
      keys.push_back(std::string(record_prefix) + std::to_string(t));
    }
    return MultiGet(keys, deadline);
  }
  // Waits until ticket `ticket` of `ticket_key` was appended with its record. The default
  // waits for that record's key.
  virtual Status WaitAppended(std::string_view ticket_key, std::string_view record_prefix,
                              int64_t ticket, Deadline deadline) {
    (void)ticket_key;
    return Wait({std::string(record_prefix) + std::to_string(ticket)}, deadline);
  }

  // A rendezvous join as one step where the store can make it one request: unless one of
  // `unless_keys` exists, Append(ticket_key, record_prefix, record) and read `read_keys`
  // at that moment. `ticket` is 0 and `read` empty when refused (an unless key exists).
  // `seen` is an opaque mark of that moment for GetSince (0: none). The default is Peek,
  // then Append (not atomic: a key may appear between them, as with two calls); EtcdStore
  // does it in one txn, sent again until `deadline` after a lost answer without joining
  // twice.
  struct JoinRequest {
    std::string ticket_key;
    std::string record_prefix;
    std::string record;
    std::vector<std::string> unless_keys;
    std::vector<std::string> read_keys;
    // The caller's name for this join (random, unique): sending the same request again
    // after a call gave up takes no second ticket (EtcdStore; others ignore it).
    std::string token;
  };
  struct JoinResult {
    int64_t ticket = 0;
    std::vector<std::optional<std::string>> read;
    int64_t seen = 0;
  };
  virtual Result<JoinResult> Join(const JoinRequest& request, Deadline deadline) {
    std::vector<std::string> keys = request.unless_keys;
    keys.insert(keys.end(), request.read_keys.begin(), request.read_keys.end());
    COHORT_ASSIGN_OR_RETURN(auto values, Peek(keys, deadline));
    JoinResult out;
    for (size_t k = 0; k < request.unless_keys.size(); ++k) {
      if (values[k]) return out;
    }
    out.read.assign(values.begin() + static_cast<std::ptrdiff_t>(request.unless_keys.size()),
                    values.end());
    COHORT_ASSIGN_OR_RETURN(out.ticket, Append(request.ticket_key, request.record_prefix,
                                               request.record, deadline));
    return out;
  }
  // Get, for a key known absent at the moment `*seen` marks (a JoinResult::seen, or a mark
  // this call gave back; 0: none): a store that dates its writes waits from that moment
  // without reading first (EtcdStore: one watch from that revision). On return `*seen`
  // marks the moment of the value's write (0: unknown). The default is Get.
  virtual Result<std::string> GetSince(std::string_view key, int64_t* seen, Deadline deadline) {
    *seen = 0;
    return Get(key, deadline);
  }

  // Waits until `deadline` without asking the store anything; kCancelled once Abort() was
  // called (before or during). Offered by stores whose waits cost the store a request each
  // (EtcdStore: a watch), for callers that can afford not to be woken by a write; the
  // others say kFailedPrecondition (the default) and the caller waits on a key instead.
  virtual Status Idle(Deadline deadline) {
    (void)deadline;
    return FailedPrecondition("this store offers no idle wait");
  }

  // Waits until `key` is put after revision `since` (one at which this client read it
  // absent: BeatResult::revision), or until `deadline`: the value, or nullopt at the
  // deadline (not an error). The store keeps the wait open between calls: a call that ends
  // at its deadline leaves it in place, and the next call for the same key goes on with it
  // without asking the store anything, so a node rests on it between its beats and is still
  // told of the write at once (EtcdStore: one watch held across calls, where GetSince is a
  // watch per call). A wait the store ended (its member lost) rests until the deadline and
  // is opened again by the next call: callers that must learn the write still read the key
  // now and then. Stores that cannot say kFailedPrecondition (the default; the caller rests
  // with Idle). One caller at a time; Abort() from any thread ends it (kCancelled).
  virtual Result<std::optional<std::string>> Await(std::string_view key, int64_t since,
                                                   Deadline deadline) {
    (void)key, (void)since, (void)deadline;
    return FailedPrecondition("this store holds no wait between calls");
  }

  // One liveness step in one call (the rendezvous watcher's): Add(beat_key, 1) unless
  // beat_key is empty, read `peek_keys` at that moment (as Peek), then wait until one of
  // `wait_keys` exists or `deadline` passes. Returns the peeked values and the first wait
  // key that exists (its index and value), nullopt when the deadline passed first (not an
  // error). TcpStore does it in one round trip (BEAT), so that ten thousand watchers cost
  // the store one request each per step. The default is Add, Peek and Get, for one wait
  // key at most (none: no wait): waiting for any of several needs a store that does it
  // natively (InvalidArgument).
  struct BeatResult {
    std::vector<std::optional<std::string>> peeked;
    // Per peeked key, how long before the call it was last bumped by a beat, by the
    // store's clock; -1 when unknown (never beaten, or a store that does not say). EtcdStore
    // estimates it from the key's mod revision between two of its own answers (never off by
    // more than the time between them).
    std::vector<int64_t> peeked_age_ms;
    int64_t revision = 0;  // the store revision the keys were read at (0: unknown)
    std::optional<std::string> waited;
    size_t waited_index = 0;  // which of wait_keys `waited` is
  };
  virtual Result<BeatResult> Beat(std::string_view beat_key,
                                  const std::vector<std::string>& peek_keys,
                                  const std::vector<std::string>& wait_keys, Deadline deadline) {
    if (wait_keys.size() > 1) {
      return InvalidArgument("this store waits for one key per beat, not {}", wait_keys.size());
    }
    BeatResult out;
    if (!beat_key.empty()) COHORT_RETURN_IF_ERROR(Add(beat_key, 1, deadline).status());
    COHORT_ASSIGN_OR_RETURN(out.peeked, Peek(peek_keys, deadline));
    out.peeked_age_ms.assign(peek_keys.size(), -1);
    if (wait_keys.empty()) return out;
    auto value = Get(wait_keys[0], deadline);
    if (value.ok()) {
      out.waited = std::move(value).value();
    } else if (value.status().code() != StatusCode::kDeadlineExceeded) {
      return value.status();
    }
    return out;
  }

  // Liveness carried by this client's connection (a will): when the connection ends and
  // this client does not leave the same will again within `grace` (it reconnected), the
  // store sets `key` (unless it exists) to why the connection ended ("its store connection
  // closed", "... was reset"). A process that dies, or whose host closes its sockets, is
  // thus known gone after `grace`, with no request per heartbeat. A client that reconnects
  // leaves its wills again by itself. Stores that cannot (the default) say kFailedPrecondition:
  // the rendezvous then keeps its heartbeats alone.
  virtual Status LeaveWill(std::string_view key, Duration grace, Deadline deadline) {
    (void)key, (void)grace, (void)deadline;
    return FailedPrecondition("this store keeps no wills");
  }

  // Liveness on a lease (etcd): from the next Beat on `key`, the key exists (value "alive")
  // for as long as this client beats it at least every `ttl`; the store deletes it by itself
  // once `ttl` passed without one (the client died, hung or lost the store). A beat on it is
  // then a renewal, not a write (etcd: a lease keep-alive, which its leader answers from
  // memory, where a counter's beat is a raft entry applied by every member). A Set of the
  // key takes it off the lease (a finished node's "finished" stays). Stores that cannot
  // say kFailedPrecondition; a store with wills does not need it.
  virtual Status LeaseKey(std::string_view key, Duration ttl, Deadline deadline) {
    (void)key, (void)ttl, (void)deadline;
    return FailedPrecondition("this store keeps no leases");
  }

  // Which of `keys` have not been written for at least `quiet_for`, dated by the store's
  // own order of writes (not the caller's view of them): true for such a key, and for one
  // that is absent; false for one the store keeps on a lease (LeaseKey: its holder renews
  // it instead of writing it, and the store deletes it when the holder stops). Meant for many keys under one parent (a round's beat counters), which a
  // store may read as one range. Stores that cannot date writes, or not a key written that
  // far back, say kFailedPrecondition (the default; EtcdStore dates keys written after its
  // earliest answer even when that answer is younger than `quiet_for`). The rendezvous finds every node silent at the
  // moment one is found dead with it (a carried round leaves them all out; rendezvous.h).
  virtual Result<std::vector<bool>> Silent(const std::vector<std::string>& keys,
                                           Duration quiet_for, Deadline deadline) {
    (void)keys, (void)quiet_for, (void)deadline;
    return FailedPrecondition("this store does not date its writes");
  }

  // Writes each of `keys` with its value of `values` if none of the keys exists, in one
  // step (etcd: one txn; the embedded store: one CREATE_ALL; the memory and file stores:
  // under their lock); true when the keys then hold `values` (a call sent again after a
  // lost answer finds its own values: true), false when a key held something else (nothing
  // written). A carried round's end writes its three keys with one request this way
  // (docs/rendezvous.md). The default, for a store without such a step, is a compare-and-set
  // from absent per key, in order, stopping at the first key that holds something else: the
  // keys before it stay written.
  virtual Result<bool> CreateAll(const std::vector<std::string>& keys,
                                 const std::vector<std::string>& values, Deadline deadline) {
    if (keys.size() != values.size()) {
      return InvalidArgument("{} keys but {} values to create", keys.size(), values.size());
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      COHORT_ASSIGN_OR_RETURN(std::string now, CompareSet(keys[i], "", values[i], deadline));
      if (now != values[i]) return false;
    }
    return true;
  }
};

// Wraps a store and prefixes every key with "<prefix>/". NumKeys counts the whole store.
// Declares every method of the Store interface in a class that implements it, so each
// store's header states "all of Store" in one line and no list can drift from the
// interface: COHORT_STORE_METHODS(override);
#define COHORT_STORE_METHODS(specifier)                                                    \
  Status Set(std::string_view key, std::string_view value, Deadline deadline) specifier;   \
  Result<std::string> Get(std::string_view key, Deadline deadline) specifier;              \
  Result<int64_t> Add(std::string_view key, int64_t delta, Deadline deadline) specifier;   \
  Result<std::string> CompareSet(std::string_view key, std::string_view expected,          \
                                 std::string_view desired, Deadline deadline) specifier;   \
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) specifier;          \
  Result<bool> Check(const std::vector<std::string>& keys, Deadline deadline) specifier;   \
  Result<std::vector<std::optional<std::string>>> Peek(const std::vector<std::string>& keys, \
                                                       Deadline deadline) specifier;       \
  Result<bool> Delete(std::string_view key, Deadline deadline) specifier;                  \
  Result<int64_t> NumKeys(Deadline deadline) specifier;                                    \
  Result<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,          \
                                            Deadline deadline) specifier;                  \
  Status MultiSet(const std::vector<std::string>& keys,                                    \
                  const std::vector<std::string>& values, Deadline deadline) specifier;    \
  void Abort() specifier

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}

  Status Set(std::string_view key, std::string_view value, Deadline deadline) override {
    return base_->Set(Key(key), value, deadline);
  }
  Result<std::string> Get(std::string_view key, Deadline deadline) override {
    return base_->Get(Key(key), deadline);
  }
  Result<int64_t> Add(std::string_view key, int64_t delta, Deadline deadline) override {
    return base_->Add(Key(key), delta, deadline);
  }
  Result<std::string> CompareSet(std::string_view key, std::string_view expected,
                                 std::string_view desired, Deadline deadline) override {
    return base_->CompareSet(Key(key), expected, desired, deadline);
  }
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override {
    return base_->Wait(Keys(keys), deadline);
  }
  Result<bool> Check(const std::vector<std::string>& keys, Deadline deadline) override {
    return base_->Check(Keys(keys), deadline);
  }
  Result<std::vector<std::optional<std::string>>> Peek(const std::vector<std::string>& keys,
                                                       Deadline deadline) override {
    return base_->Peek(Keys(keys), deadline);
  }
  Result<bool> Delete(std::string_view key, Deadline deadline) override {
    return base_->Delete(Key(key), deadline);
  }
  Result<int64_t> NumKeys(Deadline deadline) override { return base_->NumKeys(deadline); }
  Result<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                            Deadline deadline) override {
    return base_->MultiGet(Keys(keys), deadline);
  }
  Status MultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                  Deadline deadline) override {
    return base_->MultiSet(Keys(keys), values, deadline);
  }
  void Abort() override { base_->Abort(); }
  Result<int64_t> TakeTicket(std::string_view key, Deadline deadline) override {
    return base_->TakeTicket(Key(key), deadline);
  }
  Result<int64_t> CountTickets(std::string_view key, Deadline deadline) override {
    return base_->CountTickets(Key(key), deadline);
  }
  Result<int64_t> Append(std::string_view ticket_key, std::string_view record_prefix,
                         std::string_view value, Deadline deadline) override {
    return base_->Append(Key(ticket_key), Key(record_prefix), value, deadline);
  }
  Result<std::vector<std::string>> ReadAppended(std::string_view ticket_key,
                                                std::string_view record_prefix, int64_t first,
                                                int64_t count, Deadline deadline) override {
    return base_->ReadAppended(Key(ticket_key), Key(record_prefix), first, count, deadline);
  }
  Status WaitAppended(std::string_view ticket_key, std::string_view record_prefix,
                      int64_t ticket, Deadline deadline) override {
    return base_->WaitAppended(Key(ticket_key), Key(record_prefix), ticket, deadline);
  }
  Result<JoinResult> Join(const JoinRequest& request, Deadline deadline) override {
    JoinRequest prefixed = {Key(request.ticket_key), Key(request.record_prefix), request.record,
                            Keys(request.unless_keys), Keys(request.read_keys), request.token};
    return base_->Join(prefixed, deadline);
  }
  Result<std::string> GetSince(std::string_view key, int64_t* seen, Deadline deadline) override {
    return base_->GetSince(Key(key), seen, deadline);
  }
  Status Idle(Deadline deadline) override { return base_->Idle(deadline); }
  Result<std::optional<std::string>> Await(std::string_view key, int64_t since,
                                           Deadline deadline) override {
    return base_->Await(Key(key), since, deadline);
  }
  Result<BeatResult> Beat(std::string_view beat_key, const std::vector<std::string>& peek_keys,
                          const std::vector<std::string>& wait_keys, Deadline deadline) override {
    return base_->Beat(beat_key.empty() ? std::string() : Key(beat_key), Keys(peek_keys),
                       Keys(wait_keys), deadline);
  }
  Status LeaveWill(std::string_view key, Duration grace, Deadline deadline) override {
    return base_->LeaveWill(Key(key), grace, deadline);
  }
  Status LeaseKey(std::string_view key, Duration ttl, Deadline deadline) override {
    return base_->LeaseKey(Key(key), ttl, deadline);
  }
  Result<std::vector<bool>> Silent(const std::vector<std::string>& keys, Duration quiet_for,
                                   Deadline deadline) override {
    return base_->Silent(Keys(keys), quiet_for, deadline);
  }
  Result<bool> CreateAll(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values, Deadline deadline) override {
    return base_->CreateAll(Keys(keys), values, deadline);
  }

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string Key(std::string_view key) const { return prefix_ + std::string(key); }
  std::vector<std::string> Keys(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(Key(k));
    return out;
  }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace cohort::store
