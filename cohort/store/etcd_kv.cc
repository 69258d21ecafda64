// EtcdStore's key-value requests on the gateway (etcd_store_internal.h): reads of one key
// and of many (one txn of ranges, or one range from the smallest key to the largest),
// watches and the blocking gets built on them (Get, Wait, MultiGet, GetSince, a beat's
// wait), and puts.
//
// Thread-safety: every function here may be called from any thread at once; each request
// takes its own connection from the pool (a watch drops it when the stream ends).
#include <curl/curl.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "cohort/base/json_bounded.h"
#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/store/etcd_store_internal.h"

namespace cohort::store {

using namespace etcd;  // NOLINT: EtcdStore's shared helpers (etcd_store_internal.h)

Result<json> EtcdStore::Impl::Range(const std::string& full_key, Deadline deadline) {
  return Post("/v3/kv/range", {{"key", B64(full_key)}}, deadline);
}

// Values of many keys (nullopt = missing), through ReadKvs.
// `revision`, when given, gets the store revision the (first) read saw.
Result<std::vector<std::optional<std::string>>> EtcdStore::Impl::ReadMany(
    const std::vector<std::string>& keys, bool keys_only, Deadline deadline, int64_t* revision) {
  COHORT_ASSIGN_OR_RETURN(std::vector<json> kvs, ReadKvs(keys, keys_only, deadline, revision));
  std::vector<std::optional<std::string>> out;
  out.reserve(kvs.size());
  for (const auto& kv : kvs) {
    if (kv.is_null()) {
      out.emplace_back();
      continue;
    }
    COHORT_ASSIGN_OR_RETURN(std::string value, UnB64(kv.value("value", std::string())));
    out.emplace_back(std::move(value));
  }
  return out;
}

// The kvs of many keys as etcd answers them (null = missing). Many keys with a common
// prefix (node1..nodeN) are read with one range over the prefix when it holds few other
// keys: one range op costs etcd far less than N. Otherwise (or when the prefix holds too
// many keys), txns of at most kMaxTxnOps ranges.
Result<std::vector<json>> EtcdStore::Impl::ReadKvs(const std::vector<std::string>& keys,
                                                   bool keys_only, Deadline deadline,
                                                   int64_t* revision) {
  if (keys.size() >= kPrefixReadMinKeys) {
    COHORT_ASSIGN_OR_RETURN(auto by_span, ReadBySpan(keys, keys_only, deadline, revision));
    if (by_span) return std::move(*by_span);
  }
  std::vector<json> out;
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
      const json range = resp.value("response_range", json::object());
      const json* kv = FirstKv(range);
      out.push_back(kv != nullptr ? *kv : json());
    }
  }
  return out;
}

// ReadKvs through one range from the smallest of the keys to the largest (inclusive),
// limited to twice the number of keys; nullopt when the span holds more than that. (Until
// 2026-12-06 the range was the keys' common prefix: a round's beat keys and its layout share
// only r<R>/, which holds the round's join markers too, twice the limit at any size, so a
// lost node's `Silent` read fell back to a txn per 128 keys: 79 one after another at
// 10,000 nodes, seconds on a loaded etcd; docs/scale.md.)
Result<std::optional<std::vector<json>>> EtcdStore::Impl::ReadBySpan(
    const std::vector<std::string>& keys, bool keys_only, Deadline deadline,
    int64_t* revision) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(Full(k));
  const auto [first, last] = std::minmax_element(full.begin(), full.end());
  const size_t limit = 2 * keys.size();
  json range = {{"key", B64(*first)},
                {"range_end", B64(*last + std::string(1, '\0'))},  // the key right after it
                {"limit", std::to_string(limit)}};
  if (keys_only) range["keys_only"] = true;
  COHORT_ASSIGN_OR_RETURN(json r, Post("/v3/kv/range", range, deadline));
  if (revision != nullptr) *revision = HeaderRevision(r);
  if (r.value("more", false)) return std::optional<std::vector<json>>();
  std::unordered_map<std::string, const json*> found;
  if (r.contains("kvs")) {
    for (const auto& kv : r["kvs"]) {
      COHORT_ASSIGN_OR_RETURN(std::string key, UnB64(kv.value("key", std::string())));
      found.emplace(std::move(key), &kv);
    }
  }
  std::vector<json> out;
  out.reserve(full.size());
  for (const auto& k : full) {
    auto it = found.find(k);
    out.push_back(it == found.end() ? json() : *it->second);
  }
  return std::optional<std::vector<json>>(std::move(out));
}

Result<json> EtcdStore::Impl::WatchResult(std::string_view line, bool* bad_token) {
  json msg = ParseJsonBounded(line, kMaxReplyBytes);
  if (msg.is_discarded()) return json();
  if (msg.contains("error")) {
    bool transient = false;
    return GrpcError(msg, 200, &transient, bad_token);
  }
  return msg.contains("result") ? msg["result"] : msg;
}

std::optional<std::string> EtcdStore::Impl::PutIn(const json& result, const std::string& b64_key,
                                                   const KvAccept& accept) {
  auto events = result.find("events");
  if (events == result.end()) return std::nullopt;
  for (const auto& ev : *events) {
    if (ev.value("type", std::string("PUT")) != "PUT") continue;
    const json& kv = ev.value("kv", json::object());
    if (kv.value("key", std::string()) != b64_key || !accept(kv)) continue;
    auto v = UnB64(kv.value("value", std::string()));
    return v.ok() ? *v : std::string();
  }
  return std::nullopt;
}

// Streams a watch on `full_key` until the key is there in a state `accept` takes (a PUT
// event, or the read made once the watch is confirmed; returns its value), the watch is
// cancelled by etcd (returns nullopt: read again), or the deadline/abort/an error ends
// it. The watch starts after `absent_at`, the revision of a read that found the key
// missing or not accepted (every put since comes as an event); with 0 it starts now and
// the key is read once it is confirmed.
Result<std::optional<std::string>> EtcdStore::Impl::Watch(const std::string& full_key,
                                                          Deadline deadline, int64_t absent_at,
                                                          const KvAccept& accept) {
  ConnRef c(this);
  const std::string b64_key = B64(full_key);
  std::optional<std::string> found;
  bool cancelled = false;
  Status stream_error;
  c->on_line = [&](std::string_view line) {
    bool bad_token = false;
    auto res = WatchResult(line, &bad_token);
    if (!res.ok()) {
      stream_error = bad_token ? PermissionDenied("etcd: invalid auth token") : res.status();
      return false;
    }
    if (res->is_null()) return true;
    if (res->value("canceled", false)) {
      cancelled = true;
      return false;
    }
    if (res->value("created", false) && absent_at == 0) {
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
    found = PutIn(*res, b64_key, accept);
    return !found;
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
// (`accept`: a key there in a state it refuses counts as absent.)
// (`mod_revision`, when given, gets the revision of the value's write.)
Result<std::string> EtcdStore::Impl::GetBlocking(const std::string& full_key, Deadline deadline,
                                                 int64_t absent_at, const KvAccept& accept,
                                                 int64_t* mod_revision) {
  // The kv taken: its mod revision is the answer's mark.
  auto take = [&](const json& kv) {
    if (!accept(kv)) return false;
    if (mod_revision != nullptr) *mod_revision = Int(kv, "mod_revision");
    return true;
  };
  cohort::Backoff outage = OutageBackoff(deadline);
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
      Pause(outage.NextJittered(), deadline);
      continue;
    }
    return w.status();
  }
}

// The values of `keys` once all exist (Wait, MultiGet): one read (usually everything is
// there), then a watch per missing key from that read's revision, which hands over its
// value. (With `keys_only`, the values of keys present at the read are empty.)
Result<std::vector<std::string>> EtcdStore::Impl::ReadAllWaiting(
    const std::vector<std::string>& keys, bool keys_only, Deadline deadline) {
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

Status EtcdStore::Impl::Put(const std::string& key, std::string_view value, Deadline deadline,
                            Resend resend) {
  json req = {{"key", B64(Full(key))}, {"value", B64(value)}};
  if (int64_t lease = lease_id.load()) req["lease"] = std::to_string(lease);
  return Post("/v3/kv/put", req, deadline, true, resend).status();
}

}  // namespace cohort::store
