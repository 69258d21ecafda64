// Implements EtcdStore over etcd's v3 JSON gateway with libcurl.
//
// Thread-safety: Impl's connection pool, socket set, token, beat counters and endpoint
// index are guarded by their own mutexes or are atomics; a Conn (one CURL easy handle) is
// used by one call at a time. Abort() touches only atomics and shutdown(2) on the sockets
// libcurl opened through our open/close callbacks (both under fds_mu_, so a closed
// descriptor is never shut down).
#include "cohort/store/etcd_store.h"

#include <curl/curl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_map>
#include <thread>

#include "cohort/base/backoff.h"
#include "cohort/base/json_bounded.h"
#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/base/strings.h"

namespace cohort::store {

using json = nlohmann::json;

namespace {

constexpr const char* kLog = "store";
// etcd's answers are parsed within these bounds (json_bounded.h): nesting as any answer of
// the v3 JSON gateway has, and a size well above the largest range page.
constexpr size_t kMaxReplyBytes = size_t{1} << 30;
constexpr size_t kMaxTxnOps = 128;  // etcd's default --max-txn-ops
constexpr size_t kPrefixReadMinKeys = 8;
constexpr size_t kMaxIdleConns = 8;

// ---- base64 (etcd's JSON gateway carries keys and values as base64) ----

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

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

// An integer counter as a range response shows it (nullopt when the key is missing), and
// the compare that holds while it is unchanged: Add's and Beat's compare-and-put.
struct Counter {
  int64_t value = 0;
  int64_t mod_revision = 0;
};
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

std::once_flag curl_once;

}  // namespace

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view text, bool tls) {
  std::vector<std::string> out;
  for (const auto& raw : Split(text, ',')) {
    std::string item(Trim(raw));
    if (item.empty()) continue;
    std::string scheme = tls ? "https://" : "http://";
    if (StartsWith(item, "http://") || StartsWith(item, "https://")) {
      size_t at = item.find("://") + 3;
      scheme = item.substr(0, at);
      item = item.substr(at);
    }
    while (!item.empty() && item.back() == '/') item.pop_back();
    auto hp = ParseHostPort(item, 2379);
    if (!hp || hp->first.empty() || hp->second == 0) {
      return InvalidArgument("etcd endpoint '{}' is not host[:port] or http(s)://host:port", raw);
    }
    bool v6 = hp->first.find(':') != std::string::npos;
    out.push_back(
        fmt::format("{}{}{}{}:{}", scheme, v6 ? "[" : "", hp->first, v6 ? "]" : "", hp->second));
  }
  if (out.empty()) return InvalidArgument("no etcd endpoint given");
  return out;
}

// ---------------------------------------------------------------------------------------

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

struct EtcdStore::Impl {
  EtcdStoreOptions options;
  std::vector<std::string> urls;
  std::string root;  // "/cohort/<prefix>/"
  std::atomic<size_t> current{0};
  std::atomic<bool> aborted{false};

  Mutex pool_mu;
  std::vector<std::unique_ptr<Conn>> idle COHORT_GUARDED_BY(pool_mu);

  Mutex fds_mu;
  std::set<int> fds COHORT_GUARDED_BY(fds_mu);  // sockets libcurl opened for us

  Mutex token_mu;
  std::string token COHORT_GUARDED_BY(token_mu);  // never logged

  std::atomic<int64_t> lease_id{0};
  Mutex lease_mu;
  CondVar lease_cv;  // signalled to stop the keep-alive thread
  bool lease_stop COHORT_GUARDED_BY(lease_mu) = false;
  std::thread keepalive;

  // Beat counters as this client last wrote or read them (EtcdStore::Beat).
  Mutex beat_mu;
  std::unordered_map<std::string, Counter> beat_counters COHORT_GUARDED_BY(beat_mu);

  Mutex abort_mu;  // for abortable backoff sleeps
  CondVar abort_cv;

  // Connections go first: their cleanup calls CloseSocket, which uses fds.
  ~Impl() { idle.clear(); }

  // ---- connections ----

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
      if (impl_->idle.size() < kMaxIdleConns) impl_->idle.push_back(std::move(conn_));
    }
    Conn& operator*() { return *conn_; }
    Conn* operator->() { return conn_.get(); }
    // Drops a connection whose state is unknown (an interrupted stream).
    void Discard() { conn_.reset(); }

   private:
    Impl* impl_;
    std::unique_ptr<Conn> conn_;
  };

  static curl_socket_t OpenSocket(void* clientp, curlsocktype, struct curl_sockaddr* addr) {
    auto* self = static_cast<Impl*>(clientp);
    if (self->aborted) return CURL_SOCKET_BAD;
    int fd = ::socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
    if (fd >= 0) {
      MutexLock lock(&self->fds_mu);
      self->fds.insert(fd);
    }
    return fd;
  }
  static int CloseSocket(void* clientp, curl_socket_t fd) {
    auto* self = static_cast<Impl*>(clientp);
    MutexLock lock(&self->fds_mu);
    self->fds.erase(fd);
    return ::close(fd);
  }
  static int XferInfo(void* clientp, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<Impl*>(clientp)->aborted ? 1 : 0;
  }
  static size_t Write(char* data, size_t size, size_t n, void* userp) {
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

  std::unique_ptr<Conn> NewConn() {
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

  std::string Full(std::string_view key) const { return root + std::string(key); }

  void Rotate(size_t from) {
    size_t next = (from + 1) % urls.size();
    current.compare_exchange_strong(from, next);
  }

  // Sleeps up to `d` (or until the deadline), returning early on Abort().
  void Pause(Duration d, Deadline deadline) {
    const Deadline until = Deadline::After(d).Earlier(deadline);
    MutexLock lock(&abort_mu);
    while (!aborted.load() && abort_cv.WaitUntil(&abort_mu, until)) {
    }
  }

  // One HTTP POST on `c` to `url`; fills c.body (unary) or calls c.on_line (stream).
  CURLcode Perform(Conn& c, const std::string& url, const std::string& body, Duration timeout,
                   Duration connect_timeout, bool with_token, bool require_leader,
                   long* http_code) {
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
    CURLcode rc = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
    curl_slist_free_all(headers);
    *http_code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, http_code);
    return rc;
  }

  // Whether etcd's error message says it is behind: a write refused while more than 5,000
  // committed entries wait to be applied ("too many requests", nothing applied), or the
  // gateway's own call into etcd that timed out ("context deadline exceeded"). etcd 3.4
  // sends both as gRPC code 2, unknown: the message tells.
  static bool Behind(std::string_view message) {
    return message.find("etcdserver: too many requests") != std::string_view::npos ||
           message.find("context deadline exceeded") != std::string_view::npos;
  }
  // The same, or a proposal etcd did not commit in time: not a member gone, the cluster
  // (one raft log) behind.
  static bool Overloaded(const Status& s) {
    return Behind(s.message()) || s.message().find("request timed out") != std::string::npos;
  }

  // How a gRPC error (as the gateway reports it) maps to a Status; `transient` = worth
  // retrying on the next member.
  static Status GrpcError(const json& err, long http, bool* transient, bool* bad_token) {
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

  // Outage reports (any thread): when requests have failed for kOutageWarnMs in a row (no
  // quorum, no member reachable, the cluster behind), a warning says so, again every
  // kOutageRepeatMs while it lasts, and one line when etcd answers again. The job keeps
  // running meanwhile; without this an agent was silent through 23 s without quorum.
  static constexpr int64_t kOutageWarnMs = 2000, kOutageRepeatMs = 10000;
  std::atomic<int64_t> failing_since_ms{0};  // steady clock; 0: the last request succeeded
  std::atomic<int64_t> warned_at_ms{0};      // 0: no warning for the current outage
  static int64_t NowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void NoteFailure(const Status& last) {
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
  void NoteAnswer() {
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
  //  3. after a full cycle of failures, back off (20 ms doubling to 500 ms) and cycle again;
  //     an attempt that timed out doubles the next attempt's time
  //  4. an invalid auth token is renewed once per call
  // `resend`: kUntilDeadline for requests that are safe to apply twice (a put of a fixed
  // value, a ticket txn with its marker): they are tried until the caller's deadline, not
  // only the request timeout, so an overloaded cluster slows a join down instead of failing it.
  enum class Resend { kWithinRequestTimeout, kUntilDeadline };
  Result<json> Post(const std::string& path, const json& request, Deadline deadline,
                    bool with_token = true, Resend resend = Resend::kWithinRequestTimeout) {
    const Deadline d = resend == Resend::kUntilDeadline
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
    Duration attempt = resend == Resend::kUntilDeadline ? options.request_timeout : share;
    cohort::Backoff overload(std::chrono::milliseconds(250), std::chrono::seconds(4), d);
    size_t failures_in_cycle = 0;
    cohort::Backoff backoff(std::chrono::milliseconds(20), std::chrono::milliseconds(500), d);
    for (;;) {
      if (aborted) return Cancelled("etcd store client aborted");
      if (d.expired()) {
        if (!last.ok() && only_refused) {
          return Unavailable("no etcd member reachable at {} (last error: {})", Join(urls),
                             last.message());
        }
        return DeadlineExceeded("etcd {} did not complete within {} ms{}", path, budget_ms,
                                last.ok() ? "" : ": " + last.message());
      }
      size_t idx = current.load() % urls.size();
      const std::string& url = urls[idx];
      Duration left = d.remaining();
      long http = 0;
      CURLcode rc = Perform(*c, url + path, body, std::min(left, attempt),
                            std::min(left, share), with_token, false, &http);
      bool retry = false;
      if (rc == CURLE_OK) {
        json reply = ParseJsonBounded(c->body, kMaxReplyBytes);
        if (reply.is_discarded()) {
          last = DataLoss("etcd at {} answered {} with non-JSON (HTTP {})", url, path, http);
          only_refused = false;
          retry = true;
        } else if (http == 200 && !reply.contains("error")) {
          if (reply.contains("result") && reply.size() == 1) reply = reply["result"];
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
      } else if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE ||
                 rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_SSL_CIPHER ||
                 rc == CURLE_UNSUPPORTED_PROTOCOL) {
        return FailedPrecondition("etcd at {}: {}", url, curl_easy_strerror(rc));
      } else {
        if (rc == CURLE_OPERATION_TIMEDOUT) {
          only_refused = false;
          attempt = std::min<Duration>(2 * attempt, std::chrono::minutes(1));
        }
        last = Unavailable("{}: {}", url, curl_easy_strerror(rc));
        retry = true;
      }
      if (retry) {
        NoteFailure(last);
        COHORT_LOG_DEBUG(kLog, "etcd {} failed on {}: {}", path, url, last.message());
        Rotate(idx);
        if (++failures_in_cycle >= urls.size()) {
          failures_in_cycle = 0;
          Pause(backoff.Next(), d);
        }
      }
    }
  }

  static std::string Join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
    return out;
  }

  // POST /v3/auth/authenticate {name, password} -> token for the Authorization header.
  Status Authenticate(Deadline deadline) {
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

  // ---- KV helpers ----

  Result<json> Range(const std::string& full_key, Deadline deadline) {
    return Post("/v3/kv/range", {{"key", B64(full_key)}}, deadline);
  }

  // Values of many keys (nullopt = missing). Many keys with a common prefix (node1..nodeN)
  // are read with one range over the prefix when it holds few other keys: one range op
  // costs etcd far less than N. Otherwise (or when the prefix holds too many keys), txns of
  // at most kMaxTxnOps ranges.
  // `revision`, when given, gets the store revision the (first) read saw.
  Result<std::vector<std::optional<std::string>>> ReadMany(const std::vector<std::string>& keys,
                                                           bool keys_only, Deadline deadline,
                                                           int64_t* revision = nullptr) {
    if (keys.size() >= kPrefixReadMinKeys) {
      COHORT_ASSIGN_OR_RETURN(auto by_prefix, ReadByPrefix(keys, keys_only, deadline, revision));
      if (by_prefix) return std::move(*by_prefix);
    }
    std::vector<std::optional<std::string>> out;
    for (size_t start = 0; start < keys.size(); start += kMaxTxnOps) {
      size_t end = std::min(keys.size(), start + kMaxTxnOps);
      json ops = json::array();
      for (size_t i = start; i < end; ++i) {
        json range = {{"key", B64(Full(keys[i]))}};
        if (keys_only) range["keys_only"] = true;
        ops.push_back({{"request_range", range}});
      }
      COHORT_ASSIGN_OR_RETURN(json r, Post("/v3/kv/txn", {{"success", ops}}, deadline));
      if (revision != nullptr && start == 0) *revision = HeaderRevision(r);
      const json& responses = r.contains("responses") ? r["responses"] : json::array();
      if (responses.size() != end - start) return DataLoss("etcd txn answered too few ranges");
      for (const auto& resp : responses) {
        COHORT_ASSIGN_OR_RETURN(auto v, RangeValue(resp.value("response_range", json::object())));
        out.push_back(std::move(v));
      }
    }
    return out;
  }

  // ReadMany through one range over the keys' longest common prefix, limited to twice the
  // number of keys; nullopt when the prefix holds more than that.
  Result<std::optional<std::vector<std::optional<std::string>>>> ReadByPrefix(
      const std::vector<std::string>& keys, bool keys_only, Deadline deadline,
      int64_t* revision) {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(Full(k));
    std::string prefix = full[0];
    for (const auto& k : full) {
      size_t n = 0;
      while (n < prefix.size() && n < k.size() && prefix[n] == k[n]) ++n;
      prefix.resize(n);
    }
    const size_t limit = 2 * keys.size();
    json range = {{"key", B64(prefix)},
                  {"range_end", B64(PrefixEnd(prefix))},
                  {"limit", std::to_string(limit)}};
    if (keys_only) range["keys_only"] = true;
    COHORT_ASSIGN_OR_RETURN(json r, Post("/v3/kv/range", range, deadline));
    if (revision != nullptr) *revision = HeaderRevision(r);
    using Values = std::vector<std::optional<std::string>>;
    if (r.value("more", false)) return std::optional<Values>();
    std::unordered_map<std::string, std::string> found;
    if (r.contains("kvs")) {
      for (const auto& kv : r["kvs"]) {
        COHORT_ASSIGN_OR_RETURN(std::string key, UnB64(kv.value("key", std::string())));
        COHORT_ASSIGN_OR_RETURN(std::string value, UnB64(kv.value("value", std::string())));
        found.emplace(std::move(key), std::move(value));
      }
    }
    std::vector<std::optional<std::string>> out;
    for (const auto& k : full) {
      auto it = found.find(k);
      out.push_back(it == found.end() ? std::nullopt : std::optional<std::string>(it->second));
    }
    return std::optional<Values>(std::move(out));
  }

  // Which of a key's states a wait waits for (its kv as etcd shows it): by default any.
  using KvAccept = std::function<bool(const json& kv)>;
  static bool AnyKv(const json&) { return true; }

  // Streams a watch on `full_key` until the key is there in a state `accept` takes (a PUT
  // event, or the read made once the watch is confirmed; returns its value), the watch is
  // cancelled by etcd (returns nullopt: read again), or the deadline/abort/an error ends
  // it. The watch starts after `absent_at`, the revision of a read that found the key
  // missing or not accepted (every put since comes as an event); with 0 it starts now and
  // the key is read once it is confirmed.
  Result<std::optional<std::string>> Watch(const std::string& full_key, Deadline deadline,
                                           int64_t absent_at, const KvAccept& accept = AnyKv) {
    ConnRef c(this);
    const std::string b64_key = B64(full_key);
    std::optional<std::string> found;
    bool cancelled = false;
    Status stream_error;
    c->on_line = [&](std::string_view line) {
      json msg = ParseJsonBounded(line, kMaxReplyBytes);
      if (msg.is_discarded()) return true;
      if (msg.contains("error")) {
        bool transient = false, bad_token = false;
        stream_error = GrpcError(msg, 200, &transient, &bad_token);
        if (bad_token) stream_error = PermissionDenied("etcd: invalid auth token");
        return false;
      }
      const json& res = msg.contains("result") ? msg["result"] : msg;
      if (res.value("canceled", false)) {
        cancelled = true;
        return false;
      }
      if (res.value("created", false) && absent_at == 0) {
        // The watch sees every change from now on; read once to catch a put before it.
        auto now = Range(full_key, deadline);
        if (!now.ok()) {
          stream_error = now.status();
          return false;
        }
        auto value = RangeValue(*now);
        if (!value.ok()) {
          stream_error = value.status();
          return false;
        }
        if (*value && accept(*FirstKv(*now))) {
          found = std::move(**value);
          return false;
        }
      }
      auto events = res.find("events");
      if (events == res.end()) return true;
      for (const auto& ev : *events) {
        if (ev.value("type", std::string("PUT")) != "PUT") continue;
        const json& kv = ev.value("kv", json::object());
        if (kv.value("key", std::string()) != b64_key || !accept(kv)) continue;
        auto v = UnB64(kv.value("value", std::string()));
        found = v.ok() ? *v : std::string();
        return false;
      }
      return true;
    };
    // A watch from a past revision is caught up by etcd's sync loop (within about 100 ms
    // when writes came in between), which is fine for a wait of a join or a watcher step,
    // and saves the read once the watch is confirmed (a request per wait).
    json request = {{"create_request", {{"key", b64_key}}}};
    if (absent_at > 0) request["create_request"]["start_revision"] = std::to_string(absent_at + 1);
    size_t idx = current.load() % urls.size();
    long http = 0;
    Duration left = deadline.remaining();
    CURLcode rc = Perform(*c, urls[idx] + "/v3/watch", request.dump(), left,
                          std::min(left, options.request_timeout), /*with_token=*/true,
                          /*require_leader=*/true, &http);
    c->on_line = nullptr;
    c.Discard();  // the stream was cut mid-way: do not reuse its connection
    if (found) return found;
    if (aborted || rc == CURLE_ABORTED_BY_CALLBACK) return Cancelled("etcd store client aborted");
    if (cancelled) return std::optional<std::string>();
    if (!stream_error.ok()) {
      if (stream_error.code() == StatusCode::kPermissionDenied && !options.user.empty()) {
        COHORT_RETURN_IF_ERROR(Authenticate(deadline));
        return std::optional<std::string>();
      }
      if (stream_error.code() == StatusCode::kUnavailable) Rotate(idx);
      return stream_error;
    }
    if (rc == CURLE_OPERATION_TIMEDOUT && deadline.expired()) {
      return DeadlineExceeded("etcd key '{}' did not appear before the deadline", full_key);
    }
    // Lost the member (or it ended the stream): the caller reads again, elsewhere.
    Rotate(idx);
    return Unavailable("etcd watch on {} ended: {}", urls[idx],
                       rc == CURLE_OK ? std::string("stream closed") : curl_easy_strerror(rc));
  }

  // Get that blocks until the key exists:
  //  1. range read; present -> done (skipped when the caller saw the key absent at revision
  //     `absent_at` > 0, or just saw it absent: kWatchNow)
  //  2. watch the key from the revision after that read (every later put is an event); with
  //     kWatchNow, from now, reading the key again once etcd confirms the watch
  //  3. a PUT event carries the value; a cancelled watch (compacted history) or a lost one
  //     goes back to 1
  static constexpr int64_t kReadFirst = -1, kWatchNow = 0;
  // (`accept`: a key there in a state it refuses counts as absent.)
  // (`mod_revision`, when given, gets the revision of the value's write.)
  Result<std::string> GetBlocking(const std::string& full_key, Deadline deadline,
                                  int64_t absent_at = kReadFirst,
                                  const KvAccept& accept = AnyKv,
                                  int64_t* mod_revision = nullptr) {
    // The kv taken: its mod revision is the answer's mark.
    auto take = [&](const json& kv) {
      if (!accept(kv)) return false;
      if (mod_revision != nullptr) *mod_revision = Int(kv, "mod_revision");
      return true;
    };
    for (;;) {
      if (absent_at == kReadFirst) {
        COHORT_ASSIGN_OR_RETURN(json r, Range(full_key, deadline));
        COHORT_ASSIGN_OR_RETURN(auto value, RangeValue(r));
        if (value && take(*FirstKv(r))) return std::move(*value);
        absent_at = std::max<int64_t>(HeaderRevision(r), kWatchNow);
      }
      auto w = Watch(full_key, deadline, absent_at, take);
      absent_at = kReadFirst;
      if (w.ok()) {
        if (*w) return std::move(**w);
        continue;
      }
      if (w.status().code() == StatusCode::kUnavailable) {
        // A watch that failed (could not connect, lost its member, no leader) and whose
        // deadline has passed meanwhile saw nothing: a timeout (a watcher's step takes it as
        // "nothing happened"; its next call reports a store that is really gone).
        if (deadline.expired()) {
          return DeadlineExceeded("etcd key '{}' did not appear before the deadline ({})",
                                  full_key, w.status().message());
        }
        COHORT_LOG_DEBUG(kLog, "{}; reading again", w.status().message());
        Pause(std::chrono::milliseconds(20), deadline);
        continue;
      }
      return w.status();
    }
  }

  // The values of `keys` once all exist (Wait, MultiGet): one read (usually everything is
  // there), then a watch per missing key from that read's revision, which hands over its
  // value. (With `keys_only`, the values of keys present at the read are empty.)
  Result<std::vector<std::string>> ReadAllWaiting(const std::vector<std::string>& keys,
                                                  bool keys_only, Deadline deadline) {
    int64_t revision = 0;
    COHORT_ASSIGN_OR_RETURN(auto values, ReadMany(keys, keys_only, deadline, &revision));
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (size_t k = 0; k < keys.size(); ++k) {
      if (values[k]) {
        out.push_back(std::move(*values[k]));
        continue;
      }
      COHORT_ASSIGN_OR_RETURN(std::string v, GetBlocking(Full(keys[k]), deadline, revision));
      out.push_back(std::move(v));
    }
    return out;
  }

  Status Put(const std::string& key, std::string_view value, Deadline deadline,
             Resend resend = Resend::kWithinRequestTimeout) {
    json req = {{"key", B64(Full(key))}, {"value", B64(value)}};
    if (int64_t lease = lease_id.load()) req["lease"] = std::to_string(lease);
    return Post("/v3/kv/put", req, deadline, true, resend).status();
  }

  // ---- tickets and their records ----
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

  // One txn: unless this call's marker or one of `unless` exists, put the ticket key asking
  // for it as it was, create the marker holding `record` and read `reads`. etcd
  // applies writes one at a time, so the previous version + 1 is this caller's position (1
  // when the key was new), no two callers get the same one, and it costs etcd O(1) however
  // many tickets were taken. Sent again until `deadline` when an answer is lost: a txn sent
  // again finds its marker and takes no second ticket (its ticket is the version the ticket
  // key had at the marker's revision). The marker has no lease: the records' order must
  // not change while the job runs.
  // `token` (non-empty) names the marker: the caller's retry of the same join with the same
  // token (after this call gave up) takes no second ticket either.
  Result<TicketAnswer> TicketTxn(std::string_view key, std::string_view record,
                                 const std::vector<std::string>& unless,
                                 const std::vector<std::string>& reads, Deadline deadline,
                                 std::string_view token = {}) {
    if (unless.size() + reads.size() + 2 > kMaxTxnOps) {
      return InvalidArgument("a ticket txn of {} keys is more than etcd's {} ops",
                             unless.size() + reads.size() + 2, kMaxTxnOps);
    }
    const std::string ticket_key = B64(TicketKey(key));
    const std::string marker =
        B64(MarkerPrefix(key) + (token.empty() ? RandomHex(16) : std::string(token)));
    json compare = json::array({AbsentCompare(marker)});
    for (const auto& k : unless) compare.push_back(AbsentCompare(B64(Full(k))));
    json success = json::array({{{"request_put", {{"key", ticket_key}, {"prev_kv", true}}}},
                                {{"request_put", {{"key", marker}, {"value", B64(record)}}}}});
    // (The failure branch reads the marker only: etcd's gateway decodes every op of a txn.)
    json failure = json::array({{{"request_range", {{"key", marker}}}}});
    for (const auto& k : reads) success.push_back({{"request_range", {{"key", B64(Full(k))}}}});
    json txn = {{"compare", compare}, {"success", success}, {"failure", failure}};
    COHORT_ASSIGN_OR_RETURN(json r,
                            Post("/v3/kv/txn", txn, deadline, true, Resend::kUntilDeadline));
    const json& responses = r.contains("responses") ? r["responses"] : json::array();
    const bool succeeded = r.value("succeeded", false);
    const size_t ops = succeeded ? 2 + reads.size() : 1;
    if (responses.size() != ops) {
      return DataLoss("etcd ticket txn answered {} ops, not {}", responses.size(), ops);
    }
    TicketAnswer out;
    out.revision = HeaderRevision(r);
    if (succeeded) {
      for (size_t k = 0; k < reads.size(); ++k) {
        out.reads.push_back(responses[2 + k].value("response_range", json::object()));
      }
      const json put = responses[0].value("response_put", json::object());
      auto prev = put.find("prev_kv");
      if (prev == put.end() || !prev->is_object()) {
        out.ticket = 1;
      } else {
        const int64_t version = Int(*prev, "version");
        if (version < 1) return DataLoss("etcd answered a ticket put with a versionless key");
        out.ticket = version + 1;
      }
      return out;
    }
    const json marker_range = responses[0].value("response_range", json::object());
    const json* marker_kv = FirstKv(marker_range);
    if (marker_kv == nullptr) return out;  // refused: an `unless` key exists
    // This call's first txn was applied: read the ticket key and `reads` as it left them.
    const std::string at = std::to_string(Int(*marker_kv, "create_revision"));
    json ranges = json::array({{{"request_range", {{"key", ticket_key}, {"revision", at}}}}});
    for (const auto& k : reads) {
      ranges.push_back({{"request_range", {{"key", B64(Full(k))}, {"revision", at}}}});
    }
    COHORT_ASSIGN_OR_RETURN(json then, Post("/v3/kv/txn", {{"success", ranges}}, deadline, true,
                                            Resend::kUntilDeadline));
    const json& answers = then.contains("responses") ? then["responses"] : json::array();
    if (answers.size() != 1 + reads.size()) return DataLoss("etcd answered too few ranges");
    const json ticket_range = answers[0].value("response_range", json::object());
    const json* ticket_kv = FirstKv(ticket_range);
    if (ticket_kv == nullptr) return DataLoss("etcd ticket key missing at revision {}", at);
    out.ticket = Int(*ticket_kv, "version");
    for (size_t k = 0; k < reads.size(); ++k) {
      out.reads.push_back(answers[1 + k].value("response_range", json::object()));
    }
    return out;
  }

  // The records of tickets first..last of `key`: every marker, read a page at a time in
  // key order (a range sorted by key stops at its limit; one sorted by create revision
  // reads them all on every page), then put in the order of their create revisions.
  // kNotFound when fewer than `last` tickets were taken.
  Result<std::vector<std::string>> TicketRecords(std::string_view key, int64_t first,
                                                 int64_t last, Deadline deadline) {
    constexpr int64_t kPage = 1000;
    const std::string prefix = MarkerPrefix(key);
    std::vector<std::pair<int64_t, std::string>> markers;  // create revision, b64 record
    std::string from = prefix;
    for (;;) {
      json range = {{"key", B64(from)},
                    {"range_end", B64(PrefixEnd(prefix))},
                    {"limit", std::to_string(kPage)}};
      COHORT_ASSIGN_OR_RETURN(json r, Post("/v3/kv/range", range, deadline));
      auto kvs = r.find("kvs");
      if (kvs == r.end() || !kvs->is_array() || kvs->empty()) break;
      for (const auto& kv : *kvs) {
        markers.emplace_back(Int(kv, "create_revision"), kv.value("value", std::string()));
      }
      if (!r.value("more", false)) break;
      COHORT_ASSIGN_OR_RETURN(std::string last_key,
                              UnB64(kvs->back().value("key", std::string())));
      from = last_key + std::string(1, '\0');
    }
    if (static_cast<int64_t>(markers.size()) < last) {
      return NotFound("{} ticket(s) of '{}' have records, not {}", markers.size(), key, last);
    }
    std::sort(markers.begin(), markers.end());
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(last - first + 1));
    for (int64_t t = first; t <= last; ++t) {
      COHORT_ASSIGN_OR_RETURN(std::string record, UnB64(markers[t - 1].second));
      out.push_back(std::move(record));
    }
    return out;
  }

  // The beat txn of EtcdStore::Beat: increments `beat_key` (known value and mod_revision
  // from this client's last beat, else read by a lost compare) and runs `reads` in the same
  // txn; returns the successful txn's answer (its responses: the put, then `reads`).
  Result<json> BeatTxn(const std::string& beat_key, const json& reads, Deadline deadline) {
    const std::string k = B64(Full(beat_key));
    const json read_counter = json::array({{{"request_range", {{"key", k}}}}});
    for (;;) {
      std::optional<Counter> known;
      {
        MutexLock lock(&beat_mu);
        if (auto it = beat_counters.find(beat_key); it != beat_counters.end()) known = it->second;
      }
      const int64_t next = known ? known->value + 1 : 1;
      json put_then_reads = json::array(
          {{{"request_put", {{"key", k}, {"value", B64(std::to_string(next))}}}}});
      put_then_reads.insert(put_then_reads.end(), reads.begin(), reads.end());
      json txn = {{"compare", json::array({UnchangedCompare(k, known)})},
                  {"success", put_then_reads},
                  {"failure", read_counter}};
      COHORT_ASSIGN_OR_RETURN(json r, Post("/v3/kv/txn", txn, deadline));
      MutexLock lock(&beat_mu);
      if (r.value("succeeded", false)) {
        beat_counters[beat_key] = {next, HeaderRevision(r)};
        return r;
      }
      const json& responses = r.contains("responses") ? r["responses"] : json::array();
      if (responses.empty()) return DataLoss("etcd beat txn failed without its range response");
      COHORT_ASSIGN_OR_RETURN(
          auto current,
          CounterIn(responses[0].value("response_range", json::object()), beat_key));
      if (current) {
        beat_counters[beat_key] = *current;
      } else {
        beat_counters.erase(beat_key);
      }
    }
  }

  // ---- lease ----

  Status GrantLease(Deadline deadline) {
    int64_t ttl =
        std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(options.lease_ttl).count());
    COHORT_ASSIGN_OR_RETURN(json r,
                            Post("/v3/lease/grant", {{"TTL", std::to_string(ttl)}}, deadline));
    int64_t id = Int(r, "ID");
    if (id == 0) return Internal("etcd granted a lease without an ID");
    lease_id = id;
    return Status::Ok();
  }

  // Keep-alive thread: refreshes the lease every TTL/3; a lease etcd no longer knows (it
  // expired while we were cut off) is replaced by a new one, with a warning.
  void KeepAliveLoop() {
    pthread_setname_np(pthread_self(), "etcd-lease");
    const Duration period =
        std::max<Duration>(options.lease_ttl / 3, std::chrono::milliseconds(100));
    for (;;) {
      {
        const Deadline next = Deadline::After(period);
        MutexLock lock(&lease_mu);
        while (!lease_stop && lease_cv.WaitUntil(&lease_mu, next)) {
        }
        if (lease_stop) break;
      }
      Deadline d = Deadline::After(std::max<Duration>(period, std::chrono::seconds(1)));
      auto r = Post("/v3/lease/keepalive", {{"ID", std::to_string(lease_id.load())}}, d);
      if (r.ok() && Int(*r, "TTL") <= 0) {
        COHORT_LOG_WARN(kLog,
                        "etcd lease {:x} expired; keys attached to it are gone; "
                        "granting a new lease",
                        lease_id.load());
        Status s = GrantLease(d);
        if (!s.ok()) COHORT_LOG_WARN(kLog, "etcd lease grant failed: {}", s.message());
      } else if (!r.ok() && r.status().code() != StatusCode::kCancelled) {
        COHORT_LOG_WARN(kLog, "etcd lease keep-alive failed: {}", r.status().message());
      }
    }
  }
};

// ---------------------------------------------------------------------------------------

EtcdStore::EtcdStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<EtcdStore>> EtcdStore::Connect(const EtcdStoreOptions& options,
                                                      Deadline deadline) {
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.request_timeout <= Duration::zero()) {
    return InvalidArgument("etcd request timeout must be positive");
  }
  bool tls = !options.ca_file.empty() || !options.cert_file.empty();
  for (const auto& e : options.endpoints) {
    COHORT_ASSIGN_OR_RETURN(auto urls, ParseEtcdEndpoints(e, tls));
    impl->urls.insert(impl->urls.end(), urls.begin(), urls.end());
  }
  if (impl->urls.empty()) return InvalidArgument("no etcd endpoint given");
  impl->root = "/cohort/" + options.prefix + "/";
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(impl)));
  Impl& i = *store->impl_;
  if (!options.user.empty()) COHORT_RETURN_IF_ERROR(i.Authenticate(deadline));
  // Reach a member (and check the token) before handing out the store.
  auto probe = store->NumKeys(deadline);
  if (!probe.ok()) return probe.status().WithContext("etcd");
  if (options.lease_ttl > Duration::zero()) {
    COHORT_RETURN_IF_ERROR(i.GrantLease(deadline));
    i.keepalive = std::thread([&i] { i.KeepAliveLoop(); });
  }
  return store;
}

EtcdStore::~EtcdStore() {
  Impl& i = *impl_;
  if (i.keepalive.joinable()) {
    {
      MutexLock lock(&i.lease_mu);
      i.lease_stop = true;
    }
    i.lease_cv.SignalAll();
    i.keepalive.join();
  }
  if (int64_t lease = i.lease_id.load(); lease != 0 && !i.aborted) {
    auto r = i.Post("/v3/lease/revoke", {{"ID", std::to_string(lease)}}, Deadline::AfterMs(1000));
    if (!r.ok()) COHORT_LOG_DEBUG(kLog, "etcd lease revoke failed: {}", r.status().message());
  }
}

int64_t EtcdStore::lease_id() const { return impl_->lease_id.load(); }

std::string EtcdStore::endpoint() const {
  return impl_->urls[impl_->current.load() % impl_->urls.size()];
}

Status EtcdStore::Idle(Deadline deadline) {
  if (!impl_->aborted) impl_->Pause(deadline.remaining(), deadline);
  if (impl_->aborted) return Cancelled("etcd store client aborted");
  return Status::Ok();
}

void EtcdStore::Abort() {
  Impl& i = *impl_;
  i.aborted = true;
  { MutexLock lock(&i.abort_mu); }  // a Pause between its check and its wait sees it
  i.abort_cv.SignalAll();
  MutexLock lock(&i.fds_mu);
  for (int fd : i.fds) ::shutdown(fd, SHUT_RDWR);
}

Status EtcdStore::Set(std::string_view key, std::string_view value, Deadline deadline) {
  return impl_->Put(std::string(key), value, deadline);
}

Result<std::string> EtcdStore::Get(std::string_view key, Deadline deadline) {
  return impl_->GetBlocking(impl_->Full(key), deadline);
}

// Add: read, then txn(compare mod_revision == read's, or create_revision == 0 when missing)
// put(new) else range; a lost race retries with the value the failed txn read.
Result<int64_t> EtcdStore::Add(std::string_view key, int64_t delta, Deadline deadline) {
  Impl& i = *impl_;
  const std::string k = B64(i.Full(key));
  COHORT_ASSIGN_OR_RETURN(json range, i.Post("/v3/kv/range", {{"key", k}}, deadline));
  for (;;) {
    COHORT_ASSIGN_OR_RETURN(auto current, CounterIn(range, key));
    // Adding 0 to an existing counter is a read: no write, so readers never contend.
    if (delta == 0 && current) return current->value;
    const int64_t next = (current ? current->value : 0) + delta;
    json txn = {
        {"compare", json::array({UnchangedCompare(k, current)})},
        {"success",
         json::array({{{"request_put", {{"key", k}, {"value", B64(std::to_string(next))}}}}})},
        {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
    COHORT_ASSIGN_OR_RETURN(json r, i.Post("/v3/kv/txn", txn, deadline));
    if (r.value("succeeded", false)) return next;
    if (!r.contains("responses") || r["responses"].empty()) {
      return DataLoss("etcd txn failed without its range response");
    }
    range = r["responses"][0].value("response_range", json::object());
  }
}

Result<std::string> EtcdStore::CompareSet(std::string_view key, std::string_view expected,
                                          std::string_view desired, Deadline deadline) {
  Impl& i = *impl_;
  const std::string k = B64(i.Full(key));
  json compare =
      expected.empty()
          ? AbsentCompare(k)
          : json{{"key", k}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", B64(expected)}};
  json txn = {{"compare", json::array({compare})},
              {"success", json::array({{{"request_put", {{"key", k}, {"value", B64(desired)}}}}})},
              {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
  COHORT_ASSIGN_OR_RETURN(json r, i.Post("/v3/kv/txn", txn, deadline));
  if (r.value("succeeded", false)) return std::string(desired);
  if (!r.contains("responses") || r["responses"].empty()) {
    return DataLoss("etcd txn failed without its range response");
  }
  COHORT_ASSIGN_OR_RETURN(auto current,
                          RangeValue(r["responses"][0].value("response_range", json::object())));
  return current.value_or(std::string());
}

Status EtcdStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  if (impl_->aborted) return Cancelled("etcd store client aborted");
  // One key: watch at once (the watch reads the key once it is set up), which saves a read
  // when the key is absent, the usual case for a wait.
  if (keys.size() == 1) {
    return impl_->GetBlocking(impl_->Full(keys[0]), deadline, Impl::kWatchNow).status();
  }
  return impl_->ReadAllWaiting(keys, /*keys_only=*/true, deadline).status();
}

Result<bool> EtcdStore::Check(const std::vector<std::string>& keys, Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(auto present, impl_->ReadMany(keys, /*keys_only=*/true, deadline));
  return std::all_of(present.begin(), present.end(), [](const auto& v) { return v.has_value(); });
}

Result<std::vector<std::optional<std::string>>> EtcdStore::Peek(
    const std::vector<std::string>& keys, Deadline deadline) {
  return impl_->ReadMany(keys, /*keys_only=*/false, deadline);
}

Result<bool> EtcdStore::Delete(std::string_view key, Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(
      json r, impl_->Post("/v3/kv/deleterange", {{"key", B64(impl_->Full(key))}}, deadline));
  return Int(r, "deleted") > 0;
}

Result<int64_t> EtcdStore::NumKeys(Deadline deadline) {
  json req = {
      {"key", B64(impl_->root)}, {"range_end", B64(PrefixEnd(impl_->root))}, {"count_only", true}};
  COHORT_ASSIGN_OR_RETURN(json r, impl_->Post("/v3/kv/range", req, deadline));
  return Int(r, "count");
}

Result<int64_t> EtcdStore::TakeTicket(std::string_view key, Deadline deadline) {
  return Append(key, "", "", deadline);  // a ticket with an empty record
}

Result<int64_t> EtcdStore::Append(std::string_view ticket_key, std::string_view record_prefix,
                                  std::string_view value, Deadline deadline) {
  (void)record_prefix;  // the record is kept with the ticket (its marker)
  COHORT_ASSIGN_OR_RETURN(auto answer, impl_->TicketTxn(ticket_key, value, {}, {}, deadline));
  if (answer.ticket < 1) return DataLoss("etcd ticket marker vanished");
  return answer.ticket;
}

Result<int64_t> EtcdStore::CountTickets(std::string_view key, Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(json r, impl_->Range(impl_->TicketKey(key), deadline));
  const json* kv = FirstKv(r);
  return kv == nullptr ? int64_t{0} : Int(*kv, "version");
}

Result<std::vector<std::string>> EtcdStore::ReadAppended(std::string_view ticket_key,
                                                         std::string_view record_prefix,
                                                         int64_t first, int64_t count,
                                                         Deadline deadline) {
  (void)record_prefix;
  if (first < 1 || count < 0) return InvalidArgument("no tickets {}+{}", first, count);
  if (count == 0) return std::vector<std::string>();
  const int64_t last = first + count - 1;
  auto records = impl_->TicketRecords(ticket_key, first, last, deadline);
  if (records.ok() || records.status().code() != StatusCode::kNotFound) return records;
  // Not all taken yet: wait for the last one, then read again.
  COHORT_RETURN_IF_ERROR(WaitAppended(ticket_key, record_prefix, last, deadline));
  return impl_->TicketRecords(ticket_key, first, last, deadline);
}

// The ticket key's version is the number of tickets taken, each with its record: wait (one
// read, then a watch from its revision) until it reaches `ticket`.
Status EtcdStore::WaitAppended(std::string_view ticket_key, std::string_view record_prefix,
                               int64_t ticket, Deadline deadline) {
  (void)record_prefix;
  return impl_
      ->GetBlocking(impl_->TicketKey(ticket_key), deadline, Impl::kReadFirst,
                    [ticket](const json& kv) { return Int(kv, "version") >= ticket; })
      .status();
}

// One ticket txn that also checks `unless_keys` and reads `read_keys`.
Result<Store::JoinResult> EtcdStore::Join(const JoinRequest& request, Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(auto answer,
                          impl_->TicketTxn(request.ticket_key, request.record,
                                           request.unless_keys, request.read_keys, deadline,
                                           request.token));
  JoinResult out;
  out.ticket = answer.ticket;
  out.seen = answer.revision;
  for (const auto& range : answer.reads) {
    COHORT_ASSIGN_OR_RETURN(auto v, RangeValue(range));
    out.read.push_back(std::move(v));
  }
  return out;
}

// A key absent at revision `*seen`: one watch from the revision after it (etcd replays any
// put since), no read first.
Result<std::string> EtcdStore::GetSince(std::string_view key, int64_t* seen, Deadline deadline) {
  const int64_t from = *seen > 0 ? *seen : Impl::kReadFirst;
  *seen = 0;
  return impl_->GetBlocking(impl_->Full(key), deadline, from, Impl::AnyKv, seen);
}

// One txn per beat: put the counter's next value if it is still the one this client last
// wrote or saw (compare mod_revision; a missing counter: create_revision == 0), and read
// the peeked keys and the wait key in the same txn; a lost compare reads the counter
// instead, and the beat is tried again with it. A wait key still missing is then watched
// (GetBlocking: the watch and its read once confirmed). Three requests per step when
// nothing happened, not Add + Peek + Get's six; with no wait key, the txn alone.
Result<Store::BeatResult> EtcdStore::Beat(std::string_view beat_key,
                                          const std::vector<std::string>& peek_keys,
                                          const std::vector<std::string>& wait_keys,
                                          Deadline deadline) {
  if (wait_keys.size() > 1) {
    return InvalidArgument("this store waits for one key per beat, not {}", wait_keys.size());
  }
  if (peek_keys.size() + 2 > kMaxTxnOps) {
    return Store::Beat(beat_key, peek_keys, wait_keys, deadline);  // more than one txn holds
  }
  Impl& i = *impl_;
  json reads = json::array();
  for (const auto& k : peek_keys) reads.push_back({{"request_range", {{"key", B64(i.Full(k))}}}});
  for (const auto& k : wait_keys) reads.push_back({{"request_range", {{"key", B64(i.Full(k))}}}});
  json r;
  if (beat_key.empty()) {
    COHORT_ASSIGN_OR_RETURN(r, i.Post("/v3/kv/txn", {{"success", reads}}, deadline));
  } else {
    COHORT_ASSIGN_OR_RETURN(r, i.BeatTxn(std::string(beat_key), reads, deadline));
  }
  const json& responses = r.contains("responses") ? r["responses"] : json::array();
  const size_t first = beat_key.empty() ? 0 : 1;
  if (responses.size() != first + reads.size()) {
    return DataLoss("etcd beat txn answered {} ops, not {}", responses.size(),
                    first + reads.size());
  }
  auto value_of = [&](size_t op) {
    return RangeValue(responses[first + op].value("response_range", json::object()));
  };
  BeatResult out;
  for (size_t k = 0; k < peek_keys.size(); ++k) {
    COHORT_ASSIGN_OR_RETURN(auto v, value_of(k));
    out.peeked.push_back(std::move(v));
  }
  out.peeked_age_ms.assign(peek_keys.size(), -1);
  if (wait_keys.empty()) return out;  // no wait: the txn alone
  COHORT_ASSIGN_OR_RETURN(out.waited, value_of(peek_keys.size()));
  if (out.waited) return out;
  auto value = i.GetBlocking(i.Full(wait_keys[0]), deadline, HeaderRevision(r));
  if (value.ok()) {
    out.waited = std::move(value).value();
  } else if (value.status().code() != StatusCode::kDeadlineExceeded) {
    return value.status();
  }
  return out;
}

Result<int64_t> EtcdStore::DeleteAll(Deadline deadline) {
  json req = {{"key", B64(impl_->root)}, {"range_end", B64(PrefixEnd(impl_->root))}};
  COHORT_ASSIGN_OR_RETURN(json r, impl_->Post("/v3/kv/deleterange", req, deadline));
  return Int(r, "deleted");
}

Result<std::vector<std::string>> EtcdStore::MultiGet(const std::vector<std::string>& keys,
                                                     Deadline deadline) {
  return impl_->ReadAllWaiting(keys, /*keys_only=*/false, deadline);
}

Status EtcdStore::MultiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values, Deadline deadline) {
  if (keys.size() != values.size()) {
    return InvalidArgument("MultiSet: {} keys but {} values", keys.size(), values.size());
  }
  Impl& i = *impl_;
  const int64_t lease = i.lease_id.load();
  // One txn per kMaxTxnOps keys: atomic for up to 128 keys.
  for (size_t start = 0; start < keys.size(); start += kMaxTxnOps) {
    size_t end = std::min(keys.size(), start + kMaxTxnOps);
    json ops = json::array();
    for (size_t k = start; k < end; ++k) {
      json put = {{"key", B64(i.Full(keys[k]))}, {"value", B64(values[k])}};
      if (lease) put["lease"] = std::to_string(lease);
      ops.push_back({{"request_put", put}});
    }
    COHORT_RETURN_IF_ERROR(i.Post("/v3/kv/txn", {{"success", ops}}, deadline).status());
  }
  return Status::Ok();
}

}  // namespace cohort::store
