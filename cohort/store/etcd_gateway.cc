// EtcdStore's client of etcd's v3 JSON gateway (etcd_store_internal.h): base64 and the
// fields of etcd's answers, the pool of kept-open connections (CURL easy handles) and the
// socket callbacks Abort() relies on, one POST with failover over the members, retries and
// backoff, the mapping of etcd's gRPC errors to a Status, outage reports, authentication.
//
// Thread-safety: the free functions are pure. Impl's members here may be called from any
// thread: the connection pool, socket set and token are guarded by their mutexes, the
// endpoint index and outage marks are atomics, and a Conn is used by one call at a time.
#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "cohort/base/backoff.h"
#include "cohort/base/json_bounded.h"
#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/base/strings.h"
#include "cohort/store/etcd_store_internal.h"

namespace cohort::store {
namespace etcd {

// ---- base64 (etcd's JSON gateway carries keys and values as base64) ----

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string B64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> UnB64(std::string_view in) {
  static const auto table = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[uint8_t(kB64[i])] = static_cast<int8_t>(i);
    return t;
  }();
  std::string out;
  out.reserve(in.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int8_t v = table[uint8_t(c)];
    if (v < 0) return DataLoss("etcd returned malformed base64");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

// int64 fields come as JSON strings and are omitted when zero.
int64_t Int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return ParseInt64(it->get<std::string>()).value_or(0);
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

// The store revision an answer was made at (its header's), 0 when it has none.
int64_t HeaderRevision(const json& answer) {
  auto header = answer.find("header");
  return header != answer.end() && header->is_object() ? Int(*header, "revision") : 0;
}

// The first key-value of a range response, or null when it has none.
const json* FirstKv(const json& range) {
  auto kvs = range.find("kvs");
  if (kvs == range.end() || !kvs->is_array() || kvs->empty()) return nullptr;
  return &(*kvs)[0];
}

void RevisionClock::Note(SteadyClock::time_point at, int64_t revision) {
  if (revision <= 0) return;
  MutexLock lock(&mu_);
  if (!samples_.empty() && at - window_start_ < kSampleEvery) {
    // Within one sample's window: keep the higher revision, dated by the later answer (the
    // window stays where it began, so samples stay kSampleEvery apart under steady answers).
    if (revision > samples_.back().second) samples_.back() = {at, revision};
    return;
  }
  window_start_ = at;
  samples_.emplace_back(at, std::max(revision, samples_.empty() ? 0 : samples_.back().second));
  if (samples_.size() > kSamples) samples_.pop_front();
}

int64_t RevisionClock::ReachedBy(SteadyClock::time_point at) const {
  MutexLock lock(&mu_);
  // Samples are in time order and their revisions never go down: the last one at or
  // before `at` has the highest revision of them.
  auto after = std::upper_bound(samples_.begin(), samples_.end(), at,
                                [](SteadyClock::time_point t, const auto& s) { return t < s.first; });
  return after == samples_.begin() ? 0 : std::prev(after)->second;
}

int64_t RevisionClock::Earliest() const {
  MutexLock lock(&mu_);
  return samples_.empty() ? 0 : samples_.front().second;  // (Note keeps no revision 0)
}

std::optional<SteadyClock::time_point> RevisionClock::DateOf(int64_t revision) const {
  MutexLock lock(&mu_);
  auto reached = std::lower_bound(samples_.begin(), samples_.end(), revision,
                                  [](const auto& s, int64_t r) { return s.second < r; });
  if (reached == samples_.end()) return std::nullopt;
  if (reached == samples_.begin()) return reached->first;
  const auto& below = *std::prev(reached);
  const Duration span = reached->first - below.first;
  if (span > kInterpolateWithin) return reached->first;
  const double share = static_cast<double>(revision - below.second) /
                       static_cast<double>(reached->second - below.second);
  return below.first + std::chrono::duration_cast<Duration>(span * share);
}

// A key's value from a range response, or nullopt when it has no kvs.
Result<std::optional<std::string>> RangeValue(const json& range) {
  const json* first = FirstKv(range);
  if (first == nullptr) return std::optional<std::string>();
  const json& kv = *first;
  auto v = kv.find("value");
  if (v == kv.end()) return std::optional<std::string>(std::string());
  COHORT_ASSIGN_OR_RETURN(std::string value, UnB64(v->get<std::string>()));
  return std::optional<std::string>(std::move(value));
}

Result<std::optional<Counter>> CounterIn(const json& range, std::string_view key) {
  const json* kv = FirstKv(range);
  if (kv == nullptr) return std::optional<Counter>();
  COHORT_ASSIGN_OR_RETURN(auto text, RangeValue(range));
  auto value = ParseInt64(text.value_or(""));
  if (!value) return InvalidArgument("Add on key '{}' whose value is not an integer", key);
  return std::optional<Counter>(Counter{*value, Int(*kv, "mod_revision")});
}
// The txn compare that holds while a key does not exist.
json AbsentCompare(const std::string& b64_key) {
  return {{"key", b64_key}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
}
json UnchangedCompare(const std::string& b64_key, const std::optional<Counter>& known) {
  if (!known) return AbsentCompare(b64_key);
  return {{"key", b64_key},
          {"target", "MOD"},
          {"result", "EQUAL"},
          {"mod_revision", std::to_string(known->mod_revision)}};
}

// The smallest key greater than every key starting with `prefix` (etcd's range_end).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<uint8_t>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace etcd

using namespace etcd;  // NOLINT: EtcdStore's shared helpers (etcd_store_internal.h)

curl_socket_t EtcdStore::Impl::OpenSocket(void* clientp, curlsocktype,
                                          struct curl_sockaddr* addr) {
  auto* self = static_cast<Impl*>(clientp);
  if (self->aborted) return CURL_SOCKET_BAD;
  int fd = ::socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
  if (fd >= 0) {
    MutexLock lock(&self->fds_mu);
    self->fds.insert(fd);
  }
  return fd;
}
int EtcdStore::Impl::CloseSocket(void* clientp, curl_socket_t fd) {
  auto* self = static_cast<Impl*>(clientp);
  MutexLock lock(&self->fds_mu);
  self->fds.erase(fd);
  return ::close(fd);
}
int EtcdStore::Impl::XferInfo(void* clientp, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<Impl*>(clientp)->aborted ? 1 : 0;
}
size_t EtcdStore::Impl::Write(char* data, size_t size, size_t n, void* userp) {
  auto* c = static_cast<Conn*>(userp);
  size_t len = size * n;
  if (!c->on_line) {
    c->body.append(data, len);
    return len;
  }
  c->pending.append(data, len);
  size_t start = 0;
  for (;;) {
    size_t nl = c->pending.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(c->pending.data() + start, nl - start);
    start = nl + 1;
    if (!line.empty() && !c->on_line(line)) return 0;  // ends the transfer
  }
  c->pending.erase(0, start);
  return len;
}

std::unique_ptr<Conn> EtcdStore::Impl::NewConn() {
  auto c = std::make_unique<Conn>();
  COHORT_CHECK(c->curl != nullptr) << "curl_easy_init failed";
  CURL* h = c->curl;
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 10L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 5L);
  curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, &Impl::OpenSocket);
  curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, this);
  curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, &Impl::CloseSocket);
  curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, this);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, &Impl::XferInfo);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, this);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Impl::Write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, c.get());
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  if (!options.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options.ca_file.c_str());
  if (!options.cert_file.empty()) {
    curl_easy_setopt(h, CURLOPT_SSLCERT, options.cert_file.c_str());
  }
  if (!options.key_file.empty()) curl_easy_setopt(h, CURLOPT_SSLKEY, options.key_file.c_str());
  return c;
}

void EtcdStore::Impl::Rotate(size_t from) {
  size_t next = (from + 1) % urls.size();
  current.compare_exchange_strong(from, next);
}

// Sleeps up to `d` (or until the deadline), returning early on Abort().
void EtcdStore::Impl::Pause(Duration d, Deadline deadline) {
  const Deadline until = Deadline::After(d).Earlier(deadline);
  MutexLock lock(&abort_mu);
  while (!aborted.load() && abort_cv.WaitUntil(&abort_mu, until)) {
  }
}

// One HTTP POST on `c` to `url`; fills c.body (unary) or calls c.on_line (stream).
curl_slist* EtcdStore::Impl::Prepare(Conn& c, const std::string& url, const std::string& body,
                                     Duration timeout, Duration connect_timeout, bool with_token,
                                     bool require_leader) {
  CURL* h = c.curl;
  c.body.clear();
  c.pending.clear();
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  auto ms = [](Duration d) {
    if (d == Duration::max()) return 0L;
    return std::max(1L,
                    static_cast<long>(std::chrono::ceil<std::chrono::milliseconds>(d).count()));
  };
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms(timeout));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, ms(connect_timeout));
  struct curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");
  if (require_leader) headers = curl_slist_append(headers, "Grpc-Metadata-Hasleader: true");
  if (with_token) {
    MutexLock lock(&token_mu);
    if (!token.empty()) headers = curl_slist_append(headers, ("Authorization: " + token).c_str());
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  return headers;
}

CURLcode EtcdStore::Impl::Perform(Conn& c, const std::string& url, const std::string& body,
                                  Duration timeout, Duration connect_timeout, bool with_token,
                                  bool require_leader, long* http_code) {
  curl_slist* headers =
      Prepare(c, url, body, timeout, connect_timeout, with_token, require_leader);
  CURLcode rc = curl_easy_perform(c.curl);
  curl_easy_setopt(c.curl, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  *http_code = 0;
  curl_easy_getinfo(c.curl, CURLINFO_RESPONSE_CODE, http_code);
  return rc;
}

// Whether etcd's error message says it is behind: a write refused while more than 5,000
// committed entries wait to be applied ("too many requests", nothing applied), or the
// gateway's own call into etcd that timed out ("context deadline exceeded"). etcd 3.4
// sends both as gRPC code 2, unknown: the message tells.
bool EtcdStore::Impl::Behind(std::string_view message) {
  return message.find("etcdserver: too many requests") != std::string_view::npos ||
         message.find("context deadline exceeded") != std::string_view::npos;
}
// The same, or a proposal etcd did not commit in time: not a member gone, the cluster
// (one raft log) behind.
bool EtcdStore::Impl::Overloaded(const Status& s) {
  return Behind(s.message()) || ProposalPending(s);
}
bool EtcdStore::Impl::ProposalPending(const Status& s) {
  return s.message().find("request timed out") != std::string::npos;
}

// How a gRPC error (as the gateway reports it) maps to a Status; `transient` = worth
// retrying on the next member.
Status EtcdStore::Impl::GrpcError(const json& err, long http, bool* transient, bool* bad_token) {
  auto str = [](const json& j, const char* field) {
    auto it = j.find(field);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto num = [](const json& j, const char* field) {
    auto it = j.find(field);
    return it != j.end() && it->is_number_integer() ? it->get<int>() : -1;
  };
  int code = num(err, "code");
  std::string message = str(err, "message");
  if (message.empty()) message = str(err, "error");
  if (auto e = err.find("error"); e != err.end() && e->is_object()) {  // stream shape
    code = num(*e, "grpc_code");
    message = str(*e, "message");
  }
  if (message.empty()) message = fmt::format("HTTP {}", http);
  // Transient: unavailable, timed out, aborted (leader changed), etcd behind (Behind:
  // worth a retry after a pause), or HTTP 503.
  const bool overloaded = Behind(message);
  *transient = code == 14 || code == 4 || code == 10 || overloaded || http == 503;
  *bad_token = code == 16 || message.find("invalid auth token") != std::string::npos;
  std::string text = "etcd: " + message;
  if (*bad_token || message.find("authentication failed") != std::string::npos ||
      message.find("user name is empty") != std::string::npos ||
      message.find("permission denied") != std::string::npos) {
    return Status(StatusCode::kPermissionDenied, text);
  }
  if (overloaded) return Status(StatusCode::kUnavailable, text);
  switch (code) {
    case 3:
      return Status(StatusCode::kInvalidArgument, text);
    case 4:
      return Status(StatusCode::kDeadlineExceeded, text);
    case 5:
      return Status(StatusCode::kNotFound, text);
    case 7:
      return Status(StatusCode::kPermissionDenied, text);
    case 9:
      return Status(StatusCode::kFailedPrecondition, text);
    case 11:
      return Status(StatusCode::kAborted, text);  // compacted revision
    case 8:  // resource exhausted: "database space exceeded" (the operator must compact
             // and defragment), a message over the size limit
      return Status(StatusCode::kFailedPrecondition, text);
    case 14:
      return Status(StatusCode::kUnavailable, text);
    case 16:
      return Status(StatusCode::kPermissionDenied, text);
    default:
      return Status(StatusCode::kInternal, text);
  }
}

int64_t EtcdStore::Impl::NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
void EtcdStore::Impl::NoteFailure(const Status& last) {
  const int64_t now = NowMs();
  int64_t none = 0;
  failing_since_ms.compare_exchange_strong(none, now);
  const int64_t since = failing_since_ms.load();
  int64_t warned = warned_at_ms.load();
  if (since != 0 && now - since >= kOutageWarnMs && now - warned >= kOutageRepeatMs &&
      warned_at_ms.compare_exchange_strong(warned, now)) {
    COHORT_LOG_WARN(kLog, "etcd at {} has not answered for {:.0f} s (no quorum, no member "
                    "reachable, or the cluster is behind): {}; still retrying",
                    Join(urls), (now - since) / 1000.0, last.message());
  }
}
bool EtcdStore::Impl::AwaitRetryToken(Deadline deadline) {
  if (!retry_budget) return true;
  for (Duration wait = retry_budget->Take(); wait > Duration::zero();
       wait = retry_budget->Take()) {
    const int64_t now = NowMs();
    int64_t warned = shedding_warned_ms.load();
    if (now - warned >= kSheddingRepeatMs &&
        shedding_warned_ms.compare_exchange_strong(warned, now)) {
      COHORT_LOG_WARN(kLog, "etcd at {} is slow (answers take {:.0f} ms): holding back "
                      "retries to spare it ({} so far; COHORT_ETCD_RETRY_BUDGET)",
                      Join(urls),
                      std::chrono::duration<double, std::milli>(latency.average()).count(),
                      retry_budget->held());
    }
    // A random part of the wait, at most half a second (an answer to another request may
    // add a token sooner): requests held back together do not go out together.
    Pause(std::chrono::duration_cast<Duration>(
              std::min<Duration>(wait, std::chrono::milliseconds(500)) * (0.5 + RandomUnit())),
          deadline);
    if (aborted || deadline.expired()) return false;
  }
  return true;
}

Duration EtcdStore::Impl::OverloadPause(Resend resend) const {
  const Duration answer = 2 * latency.average();
  if (!UntilDeadline(resend)) {
    return std::clamp<Duration>(answer, std::chrono::milliseconds(250), std::chrono::seconds(4));
  }
  // `peers` clients each waiting peers / rate come back together at about that rate.
  const auto paced = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
      static_cast<double>(std::max<int64_t>(1, options.peers)) / kPacedRequestsPerSecond));
  const Duration ceiling = std::max<Duration>(std::chrono::seconds(4), 2 * paced);
  return std::clamp<Duration>(std::max(answer, paced), std::chrono::milliseconds(250), ceiling);
}

cohort::Backoff EtcdStore::Impl::OutageBackoff(Deadline deadline) const {
  const auto paced = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
      static_cast<double>(urls.size()) * static_cast<double>(std::max<int64_t>(1, options.peers)) /
      kPacedRequestsPerSecond));
  const Duration ceiling = std::max<Duration>(std::chrono::milliseconds(500), paced);
  return cohort::Backoff(std::chrono::milliseconds(20), ceiling, deadline);
}

void EtcdStore::Impl::NoteAnswer() {
  const int64_t since = failing_since_ms.exchange(0);
  if (since != 0 && warned_at_ms.exchange(0) != 0) {
    COHORT_LOG_WARN(kLog, "etcd at {} answers again, after {:.1f} s", Join(urls),
                    (NowMs() - since) / 1000.0);
  }
}

// A unary request with failover: tries the members in turn, each attempt bounded by a
// share of the request timeout, until one answers or the call's time is up.
//  1. call deadline = min(deadline, now + request_timeout)
//  2. attempt on the current member; a refused/dropped connection, a timeout or a
//     transient etcd error (no leader, leader changed, timed out) moves to the next member
//  3. after a full cycle of failures, back off (OutageBackoff: 20 ms doubling to 500 ms,
//     longer for many peers; jittered) and cycle again;
//     an attempt that timed out doubles the next attempt's time
//  4. an invalid auth token is renewed once per call
//  5. the error returned is the last attempt's, unless that attempt was cut short by the
//     call's own deadline after another error (a cluster without a leader): then that one
// `resend`: kUntilDeadline for requests that are safe to apply twice (a put of a fixed
// value, a ticket txn with its marker): they are tried until the caller's deadline, not
// only the request timeout, so an overloaded cluster slows a join down instead of failing it.
// Every request is safe to send again (reads, puts of fixed values, compare-and-puts, the
// ticket txn with its marker; a lease granted twice expires unused), but only within the
// client's retry budget (AwaitRetryToken).
// Why a call whose time is up failed: no member could be connected to, or none answered.
Status EtcdStore::Impl::TimedOut(const std::string& path, int64_t budget_ms, const Status& last,
                                 bool only_refused) const {
  if (!last.ok() && only_refused) {
    return Unavailable("no etcd member reachable at {} (last error: {})", Join(urls),
                       last.message());
  }
  return DeadlineExceeded("etcd {} did not complete within {} ms{}", path, budget_ms,
                          last.ok() ? "" : ": " + last.message());
}

// TLS and protocol errors: another member or a later try cannot do better.
bool EtcdStore::Impl::IsConfigurationError(CURLcode rc) {
  return rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE ||
         rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_SSL_CIPHER ||
         rc == CURLE_UNSUPPORTED_PROTOCOL;
}

// The time of a call's first attempt: a member's share of the request timeout, and never
// less than four times etcd's recent answer time (a slow cluster is not asked again, as a
// second proposal in its queue, because a fixed share ran out); a request sent until the
// caller's deadline gets the whole request timeout.
Duration EtcdStore::Impl::FirstAttempt(Resend resend, Duration share) const {
  if (UntilDeadline(resend)) return options.request_timeout;
  return std::clamp<Duration>(4 * latency.average(), share,
                              std::max(share, options.request_timeout));
}

Result<json> EtcdStore::Impl::Post(const std::string& path, const json& request,
                                   Deadline deadline, bool with_token, Resend resend) {
  const Deadline d = UntilDeadline(resend)
                         ? deadline
                         : deadline.Earlier(Deadline::After(options.request_timeout));
  const auto budget_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining()).count();
  const Duration share =
      std::max<Duration>(options.request_timeout / static_cast<int64_t>(urls.size()),
                         std::chrono::milliseconds(1000));
  const std::string body = request.dump();
  ConnRef c(this);
  Status last;
  bool only_refused = true;  // every failure so far was a connection failure
  bool renewed = false;
  // Each attempt that timed out doubles the next one's time: a member that is only slow
  // (an overloaded cluster, whose queue a request sent again joins, as a second raft
  // proposal) gets longer, while a stalled one is still left after the first share. A
  // request sent until the caller's deadline (a join's, in a burst of thousands) starts
  // with the whole request timeout.
  Duration attempt = FirstAttempt(resend, share);
  const Duration pause = OverloadPause(resend);
  cohort::Backoff overload(pause, std::chrono::seconds(4) + 4 * pause, d);
  size_t failures_in_cycle = 0;
  cohort::Backoff backoff = OutageBackoff(d);
  if (retry_budget) retry_budget->OnFirstTry();
  for (bool first = true;; first = false) {
    if (aborted) return Cancelled("etcd store client aborted");
    if (!first && !AwaitRetryToken(d) && aborted) return Cancelled("etcd store client aborted");
    if (d.expired()) return TimedOut(path, budget_ms, last, only_refused);
    size_t idx = current.load() % urls.size();
    const std::string& url = urls[idx];
    Duration left = d.remaining();
    long http = 0;
    const SteadyClock::time_point sent = SteadyClock::now();
    CURLcode rc = Perform(*c, url + path, body, std::min(left, attempt),
                          std::min(left, share), with_token, false, &http);
    bool retry = false;
    if (rc == CURLE_OK) {
      latency.Add(SteadyClock::now() - sent);
      if (retry_budget && http == 200) retry_budget->OnAnswer();
      json reply = ParseJsonBounded(c->body, kMaxReplyBytes);
      if (reply.is_discarded()) {
        last = DataLoss("etcd at {} answered {} with non-JSON (HTTP {})", url, path, http);
        only_refused = false;
        retry = true;
      } else if (http == 200 && !reply.contains("error")) {
        if (reply.contains("result") && reply.size() == 1) reply = reply["result"];
        revisions.Note(SteadyClock::now(), HeaderRevision(reply));
        NoteAnswer();
        return reply;
      } else {
        bool transient = false, bad_token = false;
        Status st = GrpcError(reply, http, &transient, &bad_token);
        if (bad_token && with_token && !options.user.empty() && !renewed) {
          renewed = true;
          COHORT_LOG_INFO(kLog, "etcd auth token rejected; authenticating again");
          Status auth = Authenticate(d);
          if (!auth.ok()) return auth;
          continue;
        }
        if (!transient) return st;
        if (resend == Resend::kUntilPending && ProposalPending(st)) return st;
        last = st.WithContext(url);
        only_refused = false;
        NoteFailure(last);
        if (Overloaded(st)) {
          // The cluster (one raft log: every member) is behind: wait before the next try,
          // longer each time and at a random part of it, or thousands of clients sending
          // again at once keep it behind (each refusal still costs etcd the request's
          // decoding: at 10,000 nodes retries were 8 txns per join).
          Pause(overload.NextJittered(), d);
          continue;
        }
        retry = true;
      }
    } else if (rc == CURLE_ABORTED_BY_CALLBACK || aborted) {
      return Cancelled("etcd store client aborted");
    } else if (IsConfigurationError(rc)) {
      return FailedPrecondition("etcd at {}: {}", url, curl_easy_strerror(rc));
    } else {
      const bool cut_short = rc == CURLE_OPERATION_TIMEDOUT && left < attempt && !last.ok();
      if (rc == CURLE_OPERATION_TIMEDOUT) {
        only_refused = false;
        attempt = std::min<Duration>(2 * attempt, std::chrono::minutes(1));
      }
      if (!cut_short) last = Unavailable("{}: {}", url, curl_easy_strerror(rc));
      retry = true;
    }
    if (retry) {
      NoteFailure(last);
      COHORT_LOG_DEBUG(kLog, "etcd {} failed on {}: {}", path, url, last.message());
      Rotate(idx);
      if (++failures_in_cycle >= urls.size()) {
        failures_in_cycle = 0;
        Pause(backoff.NextJittered(), d);
      }
    }
  }
}

std::string EtcdStore::Impl::Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// POST /v3/auth/authenticate {name, password} -> token for the Authorization header.
Status EtcdStore::Impl::Authenticate(Deadline deadline) {
  auto r = Post("/v3/auth/authenticate", {{"name", options.user}, {"password", options.password}},
                deadline,
                /*with_token=*/false);
  if (!r.ok()) {
    return Status(r.status().code(), fmt::format("etcd authentication as '{}' failed: {}",
                                                 options.user, r.status().message()));
  }
  MutexLock lock(&token_mu);
  token = r->value("token", std::string());
  return Status::Ok();
}

}  // namespace cohort::store
