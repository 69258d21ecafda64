// EtcdStore's internals, shared by the files that implement it (include it from them
// only): the helpers on etcd's JSON answers, one kept-open connection, and EtcdStore::Impl,
// whose members live in
//   etcd_gateway.cc  the gateway client: base64 and answer fields, the connection pool,
//                    one POST with failover and retries, errors, outage reports, auth;
//   etcd_kv.cc       reads of many keys, watches and the blocking gets on them, puts;
//   etcd_tickets.cc  the ticket txn, the tickets' records, the beat txn;
//   etcd_held_watch.cc  Await's watch, held open between calls;
//   etcd_store.cc    the lease keeper (and the EtcdStore methods on top of all this).
//
// Thread-safety: Impl's connection pool, socket set, token, beat counters and endpoint
// index are guarded by their own mutexes or are atomics; a Conn (one CURL easy handle) is
// used by one call at a time. The free functions are pure.
#pragma once

#include <curl/curl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cohort/base/backoff.h"
#include "cohort/base/mutex.h"
#include "cohort/base/retry_budget.h"
#include "cohort/store/etcd_store.h"

namespace cohort::store {

using json = nlohmann::json;

namespace etcd {

inline constexpr const char* kLog = "store";
// etcd's answers are parsed within these bounds (json_bounded.h): nesting as any answer of
// the v3 JSON gateway has, and a size well above the largest range page.
inline constexpr size_t kMaxReplyBytes = size_t{1} << 30;
inline constexpr size_t kMaxTxnOps = 128;  // etcd's default --max-txn-ops
inline constexpr size_t kPrefixReadMinKeys = 8;
inline constexpr size_t kMaxIdleConns = 8;

// Keys and values (base64) and the fields of etcd's answers (etcd_gateway.cc says what
// each one reads).
std::string B64(std::string_view in);
Result<std::string> UnB64(std::string_view in);
int64_t Int(const json& j, const char* field);
int64_t HeaderRevision(const json& answer);
const json* FirstKv(const json& range);
Result<std::optional<std::string>> RangeValue(const json& range);

// An integer counter as a range response shows it (nullopt when the key is missing), and
// the compare that holds while it is unchanged: Add's and Beat's compare-and-put.
struct Counter {
  int64_t value = 0;
  int64_t mod_revision = 0;
};
Result<std::optional<Counter>> CounterIn(const json& range, std::string_view key);
// Txn compares: the key does not exist; the key is as `known` (absent when nullopt).
json AbsentCompare(const std::string& b64_key);
json UnchangedCompare(const std::string& b64_key, const std::optional<Counter>& known);
std::string PrefixEnd(std::string prefix);

// When this client saw which store revisions: (answer time, the answer's header revision),
// at most one sample per kSampleEvery and kSamples in all (the oldest dropped). Every
// write at or below a revision some answer carried happened before that answer came, so
// EtcdStore::Silent dates keys' last writes (their mod revisions) by it, and a beat the
// keys it reads (DateOf). Thread-safe.
class RevisionClock {
 public:
  static constexpr auto kSampleEvery = std::chrono::milliseconds(100);
  static constexpr size_t kSamples = 4096;
  void Note(SteadyClock::time_point at, int64_t revision);
  // The highest revision an answer received at or before `at` carried; 0: none that old.
  int64_t ReachedBy(SteadyClock::time_point at) const;
  // The revision of the earliest sample kept (0: none yet; the highest of the answers in its
  // kSampleEvery window): a write above it came after those answers.
  int64_t Earliest() const;
  // When the write at `revision` happened, estimated between the answers around it (the
  // last one below it and the first one that reached it) in proportion to their revisions,
  // as writes come at a steady rate; the later answer's time when the two are more than
  // kInterpolateWithin apart or none is below it. nullopt: no answer reached it yet.
  static constexpr auto kInterpolateWithin = std::chrono::seconds(30);
  std::optional<SteadyClock::time_point> DateOf(int64_t revision) const;

 private:
  mutable Mutex mu_;
  std::deque<std::pair<SteadyClock::time_point, int64_t>> samples_ COHORT_GUARDED_BY(mu_);
  SteadyClock::time_point window_start_ COHORT_GUARDED_BY(mu_);  // of samples_.back()
};

// One kept-open HTTP connection (a CURL easy handle; libcurl keeps its sockets cached).
struct Conn {
  CURL* curl = nullptr;
  std::string body;  // the response body (unary calls)
  // Streaming calls: called with each complete line; returns false to end the transfer.
  std::function<bool(std::string_view)> on_line;
  std::string pending;  // partial line of a stream
  Conn() : curl(curl_easy_init()) {}
  ~Conn() {
    if (curl) curl_easy_cleanup(curl);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
};

// EtcdStore::Await's watch, held open between calls (etcd_held_watch.cc): one streaming
// POST to the gateway's /v3/watch on its own connection, driven by a libcurl multi handle,
// so that a call can end at its deadline and leave the stream open (etcd's events wait in
// the socket) for the next call.
struct HeldWatch {
  std::string full_key, b64_key;
  int64_t since = 0;   // puts after this revision are its events
  size_t member = 0;   // which of the endpoints it went to
  std::string body;    // the create request (libcurl reads it from here)
  std::unique_ptr<Conn> conn;
  CURLM* multi = nullptr;
  curl_slist* headers = nullptr;
  std::optional<std::string> found;  // the key's value, once put
  Status ended;                      // why etcd ended the stream (ok until it did)
  HeldWatch() = default;
  HeldWatch(const HeldWatch&) = delete;
  HeldWatch& operator=(const HeldWatch&) = delete;
  ~HeldWatch();
};

}  // namespace etcd

struct EtcdStore::Impl {
  EtcdStoreOptions options;
  std::vector<std::string> urls;
  std::string root;  // "/cohort/<prefix>/"
  std::atomic<size_t> current{0};
  std::atomic<bool> aborted{false};

  Mutex pool_mu;
  std::vector<std::unique_ptr<etcd::Conn>> idle COHORT_GUARDED_BY(pool_mu);

  Mutex fds_mu;
  std::set<int> fds COHORT_GUARDED_BY(fds_mu);  // sockets libcurl opened for us

  Mutex token_mu;
  std::string token COHORT_GUARDED_BY(token_mu);  // never logged

  std::atomic<int64_t> lease_id{0};
  Mutex lease_mu;
  CondVar lease_cv;  // signalled to stop the keep-alive thread
  bool lease_stop COHORT_GUARDED_BY(lease_mu) = false;
  std::thread keepalive;

  // The key lease (EtcdStore::LeaseKey): its ID (0: none yet, or to be granted again), TTL,
  // the key it holds now (a watcher's current round) and whether that key has been put
  // with it. A new lease is granted with held_put false: the key goes on it at the next beat.
  Mutex held_mu;
  int64_t held_lease COHORT_GUARDED_BY(held_mu) = 0;
  Duration held_ttl COHORT_GUARDED_BY(held_mu){};
  std::string held_key COHORT_GUARDED_BY(held_mu);
  bool held_put COHORT_GUARDED_BY(held_mu) = false;

  etcd::RevisionClock revisions;  // noted by Post from every answer

  // Beat counters as this client last wrote or read them (EtcdStore::Beat).
  Mutex beat_mu;
  std::unordered_map<std::string, etcd::Counter> beat_counters COHORT_GUARDED_BY(beat_mu);

  Mutex abort_mu;  // for abortable backoff sleeps
  CondVar abort_cv;

  // Outage reports (any thread): when requests have failed for kOutageWarnMs in a row (no
  // quorum, no member reachable, the cluster behind), a warning says so, again every
  // kOutageRepeatMs while it lasts, and one line when etcd answers again. The job keeps
  // running meanwhile; without this an agent was silent through 23 s without quorum.
  static constexpr int64_t kOutageWarnMs = 2000, kOutageRepeatMs = 10000;
  std::atomic<int64_t> failing_since_ms{0};  // steady clock; 0: the last request succeeded
  std::atomic<int64_t> warned_at_ms{0};      // 0: no warning for the current outage

  // Retries on a budget (base/retry_budget.h; COHORT_ETCD_RETRY_BUDGET, null: none), pauses
  // that grow with how long etcd takes to answer, and a warning (at most every
  // kSheddingRepeatMs) while retries are held back.
  std::unique_ptr<RetryBudget> retry_budget;
  LatencyTracker latency;
  static constexpr int64_t kSheddingRepeatMs = 10000;
  std::atomic<int64_t> shedding_warned_ms{0};

  // Await's watch (etcd_held_watch.cc); used by Await's caller only (one at a time).
  std::unique_ptr<etcd::HeldWatch> held_watch;

  // Connections go first: their cleanup calls CloseSocket, which uses fds.
  ~Impl() {
    held_watch.reset();
    idle.clear();
  }

  // ---- connections (etcd_gateway.cc) ----

  class ConnRef {
   public:
    explicit ConnRef(Impl* impl) : impl_(impl) {
      MutexLock lock(&impl_->pool_mu);
      if (!impl_->idle.empty()) {
        conn_ = std::move(impl_->idle.back());
        impl_->idle.pop_back();
      }
      if (!conn_) conn_ = impl_->NewConn();
    }
    ~ConnRef() {
      if (!conn_) return;
      MutexLock lock(&impl_->pool_mu);
      if (impl_->idle.size() < etcd::kMaxIdleConns) impl_->idle.push_back(std::move(conn_));
    }
    etcd::Conn& operator*() { return *conn_; }
    etcd::Conn* operator->() { return conn_.get(); }
    // Drops a connection whose state is unknown (an interrupted stream).
    void Discard() { conn_.reset(); }

   private:
    Impl* impl_;
    std::unique_ptr<etcd::Conn> conn_;
  };

  // libcurl's callbacks: sockets opened and closed through fds (for Abort), the abort check,
  // the response body or a stream's lines.
  static curl_socket_t OpenSocket(void* clientp, curlsocktype, struct curl_sockaddr* addr);
  static int CloseSocket(void* clientp, curl_socket_t fd);
  static int XferInfo(void* clientp, curl_off_t, curl_off_t, curl_off_t, curl_off_t);
  static size_t Write(char* data, size_t size, size_t n, void* userp);
  std::unique_ptr<etcd::Conn> NewConn();

  std::string Full(std::string_view key) const { return root + std::string(key); }

  // Moves the next request to the member after `from` (unless another call did already).
  void Rotate(size_t from);
  void Pause(Duration d, Deadline deadline);
  // Sets a POST of `body` (which must outlive the transfer) up on `c`; returns its header
  // list, which the caller frees once the transfer ended (after unsetting it).
  curl_slist* Prepare(etcd::Conn& c, const std::string& url, const std::string& body,
                      Duration timeout, Duration connect_timeout, bool with_token,
                      bool require_leader);
  CURLcode Perform(etcd::Conn& c, const std::string& url, const std::string& body,
                   Duration timeout, Duration connect_timeout, bool with_token,
                   bool require_leader, long* http_code);

  // etcd's errors: a cluster behind, and a gRPC error (as the gateway shows it) as a Status.
  static bool Behind(std::string_view message);
  static bool Overloaded(const Status& s);
  static Status GrpcError(const json& err, long http, bool* transient, bool* bad_token);

  // Outage reports (see failing_since_ms above).
  static int64_t NowMs();
  void NoteFailure(const Status& last);
  void NoteAnswer();
  // Waits (abortable, within `deadline`) until the retry budget lets one more request go
  // out again; false when the deadline passed or the client was aborted meanwhile.
  bool AwaitRetryToken(Deadline deadline);

  // One request on the gateway, with failover (`resend`: how long it may be sent again).
  // kUntilPending: as kUntilDeadline, but a proposal etcd took and did not apply in time
  // ("request timed out": it sits in the raft log and is most likely applied later) is
  // handed back to the caller, which looks for its effect before sending it again.
  enum class Resend { kWithinRequestTimeout, kUntilDeadline, kUntilPending };
  static bool UntilDeadline(Resend r) { return r != Resend::kWithinRequestTimeout; }
  // etcd's "request timed out": the proposal may still be applied.
  static bool ProposalPending(const Status& s);
  // The first pause after etcd said it is behind: twice its recent answer time, at least
  // 250 ms and at most 4 s (the pauses then double, jittered). For the ticket txns of a
  // join's burst (sent until the deadline, UntilDeadline: thousands of nodes at once) at
  // least peers / kPacedRequestsPerSecond too, up to twice that: the peers together come
  // back at the rate etcd applies. Not for the others: pacing every request (beats too)
  // broke rounds of 2,000 nodes on a slowed etcd (docs/scale.md).
  Duration OverloadPause(Resend resend) const;
  // The pauses after every member failed to answer (refused, dropped or timed out a
  // request, or had no leader): from 20 ms doubling to 500 ms for a few clients; for many
  // (`peers`) on up to members x peers / kPacedRequestsPerSecond, so that the peers of a
  // cluster that stays silent come back at about that rate in all (at 10,000 nodes a
  // 20 ms..500 ms cycle was tens of thousands of attempts a second while three members on
  // two cores elected no leader; docs/scale.md). Short blips still cost only tens of ms
  // (starting at a 32nd of the ceiling, a join held back by one failed cycle most likely
  // missed a round's 1 s last call). Jitter them.
  cohort::Backoff OutageBackoff(Deadline deadline) const;
  // The time of a call's first attempt (see Post).
  Duration FirstAttempt(Resend resend, Duration share) const;
  Result<json> Post(const std::string& path, const json& request, Deadline deadline,
                    bool with_token = true, Resend resend = Resend::kWithinRequestTimeout);
  Status TimedOut(const std::string& path, int64_t budget_ms, const Status& last,
                  bool only_refused) const;
  static bool IsConfigurationError(CURLcode rc);
  static std::string Join(const std::vector<std::string>& v);  // "a,b,c"
  Status Authenticate(Deadline deadline);

  // ---- KV helpers (etcd_kv.cc) ----

  Result<json> Range(const std::string& full_key, Deadline deadline);
  Result<std::vector<std::optional<std::string>>> ReadMany(const std::vector<std::string>& keys,
                                                           bool keys_only, Deadline deadline,
                                                           int64_t* revision = nullptr);
  Result<std::vector<json>> ReadKvs(const std::vector<std::string>& keys, bool keys_only,
                                    Deadline deadline, int64_t* revision = nullptr);
  Result<std::optional<std::vector<json>>> ReadBySpan(const std::vector<std::string>& keys,
                                                        bool keys_only, Deadline deadline,
                                                        int64_t* revision);

  // Which of a key's states a wait waits for (its kv as etcd shows it): by default any.
  using KvAccept = std::function<bool(const json& kv)>;
  static bool AnyKv(const json&) { return true; }
  Result<std::optional<std::string>> Watch(const std::string& full_key, Deadline deadline,
                                           int64_t absent_at, const KvAccept& accept = AnyKv);
  // One line of a watch stream (etcd's WatchResponse as the gateway sends it): its result,
  // null for a line that is not JSON, or the error it carries (`*bad_token`: an auth token
  // etcd no longer takes).
  static Result<json> WatchResult(std::string_view line, bool* bad_token);
  // The value of the first PUT event of `b64_key` in a watch result that `accept` takes.
  static std::optional<std::string> PutIn(const json& result, const std::string& b64_key,
                                          const KvAccept& accept = AnyKv);
  // GetBlocking's `absent_at`: read the key first, or watch from now (then read it).
  static constexpr int64_t kReadFirst = -1, kWatchNow = 0;
  Result<std::string> GetBlocking(const std::string& full_key, Deadline deadline,
                                  int64_t absent_at = kReadFirst,
                                  const KvAccept& accept = AnyKv,
                                  int64_t* mod_revision = nullptr);
  Result<std::vector<std::string>> ReadAllWaiting(const std::vector<std::string>& keys,
                                                  bool keys_only, Deadline deadline);
  Status Put(const std::string& key, std::string_view value, Deadline deadline,
             Resend resend = Resend::kWithinRequestTimeout);

  // ---- the held watch (etcd_held_watch.cc) ----

  // Opens Await's watch of `full_key` from the revision after `since` (no wait).
  std::unique_ptr<etcd::HeldWatch> HoldWatch(const std::string& full_key, int64_t since);
  // Serves held_watch until the key is put (its value; the watch is dropped), `deadline`
  // (nullopt; the watch stays), or etcd ends it (dropped; rests until the deadline).
  Result<std::optional<std::string>> ServeHeld(Deadline deadline);

  // ---- tickets and their records (etcd_tickets.cc) ----
  // A ticket of "<key>" is a version of "<key>/ticket"; the caller's marker
  // "<key>/t/<random>" is created in the same txn and holds its record. The markers in
  // the order of their create revisions are therefore the tickets' records in ticket order.
  std::string TicketKey(std::string_view key) const { return Full(key) + "/ticket"; }
  std::string MarkerPrefix(std::string_view key) const { return Full(key) + "/t/"; }

  // What a ticket txn answered: the ticket (0: refused), the answers of the reads, and the
  // revision the txn ran at.
  struct TicketAnswer {
    int64_t ticket = 0;
    std::vector<json> reads;  // range responses, one per read key
    int64_t revision = 0;
  };
  Result<TicketAnswer> TicketTxn(std::string_view key, std::string_view record,
                                 const std::vector<std::string>& unless,
                                 const std::vector<std::string>& reads, Deadline deadline,
                                 std::string_view token = {});
  Result<std::vector<std::string>> TicketRecords(std::string_view key, int64_t first,
                                                 int64_t last, Deadline deadline);
  Result<json> BeatTxn(const std::string& beat_key, const json& reads, Deadline deadline);

  // ---- lease (etcd_store.cc) ----

  Result<int64_t> Grant(Duration ttl, Deadline deadline);  // a new lease's ID
  Status GrantLease(Deadline deadline);  // the lease of options.lease_ttl
  void KeepAliveLoop();
  // One keep-alive of `lease`: false when etcd no longer knows it (it expired).
  Result<bool> Renew(int64_t lease, Deadline deadline);
  bool Held(const std::string& key);  // `key` is the one LeaseKey registered last
  // EtcdStore::Beat on a leased key: renews the lease (or grants it and puts the key) and
  // runs `reads` in the same txn as the put, else a read-only one; `*put`: the answer's
  // first response is the put's.
  Result<json> LeasedBeat(const std::string& key, const json& reads, Deadline deadline,
                          bool* put);
};

}  // namespace cohort::store
