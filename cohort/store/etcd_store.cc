// Implements EtcdStore (etcd_store.h) on the internals of etcd_store_internal.h: Connect,
// the Store methods as requests on etcd's v3 JSON gateway, the lease keeper (its grant and
// keep-alive thread) and the key lease that beats renew (LeaseKey).
//
// Thread-safety: see etcd_store_internal.h. Abort() touches only atomics and shutdown(2)
// on the sockets libcurl opened through our open/close callbacks (both under fds_mu, so a
// closed descriptor is never shut down); the keep-alive thread waits on lease_cv, stopped
// under lease_mu by the destructor.
#include "cohort/store/etcd_store.h"

#include <curl/curl.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/base/strings.h"
#include "cohort/base/settings.h"
#include "cohort/store/etcd_store_internal.h"

namespace cohort::store {

using namespace etcd;  // NOLINT: EtcdStore's shared helpers (etcd_store_internal.h)

namespace {

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

// ---- lease ----

Result<int64_t> EtcdStore::Impl::Grant(Duration ttl, Deadline deadline) {
  const int64_t seconds =
      std::max<int64_t>(1, std::chrono::ceil<std::chrono::seconds>(ttl).count());
  COHORT_ASSIGN_OR_RETURN(json r,
                          Post("/v3/lease/grant", {{"TTL", std::to_string(seconds)}}, deadline));
  int64_t id = Int(r, "ID");
  if (id == 0) return Internal("etcd granted a lease without an ID");
  return id;
}

Status EtcdStore::Impl::GrantLease(Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(lease_id, Grant(options.lease_ttl, deadline));
  return Status::Ok();
}

Result<bool> EtcdStore::Impl::Renew(int64_t lease, Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(
      json renewed, Post("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, deadline));
  return Int(renewed, "TTL") > 0;
}

bool EtcdStore::Impl::Held(const std::string& key) {
  MutexLock lock(&held_mu);
  return held_key == key;
}

Result<json> EtcdStore::Impl::LeasedBeat(const std::string& key, const json& reads,
                                         Deadline deadline, bool* put) {
  int64_t lease = 0;
  Duration ttl{};
  bool was_put = false;
  {
    MutexLock lock(&held_mu);
    lease = held_lease;
    ttl = held_ttl;
    was_put = held_put;
  }
  if (lease != 0 && was_put) {
    COHORT_ASSIGN_OR_RETURN(bool renewed, Renew(lease, deadline));
    if (renewed) {
      // The reads may come from this member's copy (serializable): a key seen there once
      // only ever disappears later, and the end of a round is learned at most its lag late.
      json local = reads;
      for (auto& op : local) op["request_range"]["serializable"] = true;
      *put = false;
      return Post("/v3/kv/txn", {{"success", local}}, deadline);
    }
    // Not renewed within its TTL (this client was cut off or stalled): etcd deleted the key,
    // and its watcher may have taken this node for dead meanwhile, as it should.
    COHORT_LOG_WARN(kLog, "etcd lease {:x} of '{}' expired; holding the key on a new lease",
                    lease, key);
    lease = 0;
  }
  if (lease == 0) {
    COHORT_ASSIGN_OR_RETURN(lease, Grant(ttl, deadline));
    MutexLock lock(&held_mu);
    held_lease = lease;
  }
  // Put only where the key is absent: a finished node's "finished" (written off the lease)
  // stays, and so does a put of an earlier attempt whose answer was lost.
  const std::string k = B64(Full(key));
  json ops = json::array(
      {{{"request_put", {{"key", k}, {"value", B64("alive")}, {"lease", std::to_string(lease)}}}}});
  ops.insert(ops.end(), reads.begin(), reads.end());
  json otherwise = json::array({{{"request_range", {{"key", k}}}}});
  otherwise.insert(otherwise.end(), reads.begin(), reads.end());
  COHORT_ASSIGN_OR_RETURN(json r, Post("/v3/kv/txn",
                                       {{"compare", json::array({AbsentCompare(k)})},
                                        {"success", ops},
                                        {"failure", otherwise}},
                                       deadline));
  MutexLock lock(&held_mu);
  if (held_key == key) held_put = true;
  *put = true;  // either way the first response is not one of the reads
  return r;
}

// Keep-alive thread: refreshes the lease every TTL/3; a lease etcd no longer knows (it
// expired while we were cut off) is replaced by a new one, with a warning.
void EtcdStore::Impl::KeepAliveLoop() {
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
    auto r = Renew(lease_id.load(), d);
    if (r.ok() && !*r) {
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

// ---------------------------------------------------------------------------------------

RetryBudget::Options RetryBudgetFor(double ratio, int64_t peers) {
  const double share = std::min(1.0, 100.0 / static_cast<double>(std::max<int64_t>(1, peers)));
  RetryBudget::Options o;
  o.ratio = ratio;
  o.max_tokens = std::max(1.0, o.max_tokens * share);
  return o;
}

EtcdStore::EtcdStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<EtcdStore>> EtcdStore::Connect(const EtcdStoreOptions& options,
                                                      Deadline deadline) {
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (const double ratio = settings::kEtcdRetryBudget.Get(); ratio > 0) {
    impl->retry_budget = std::make_unique<RetryBudget>(RetryBudgetFor(ratio, options.peers));
  }
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
  int64_t held = 0;
  {
    MutexLock lock(&i.held_mu);
    held = i.held_lease;
  }
  for (int64_t lease : {i.lease_id.load(), held}) {
    if (lease == 0 || i.aborted) continue;
    auto r = i.Post("/v3/lease/revoke", {{"ID", std::to_string(lease)}}, Deadline::AfterMs(1000));
    if (!r.ok()) COHORT_LOG_DEBUG(kLog, "etcd lease revoke failed: {}", r.status().message());
  }
}

Status EtcdStore::LeaseKey(std::string_view key, Duration ttl, Deadline deadline) {
  (void)deadline;  // no request: the next Beat on the key takes the lease
  if (ttl < std::chrono::seconds(1)) {
    return InvalidArgument("an etcd lease lives whole seconds; {} ms is too short",
                           std::chrono::duration_cast<std::chrono::milliseconds>(ttl).count());
  }
  // etcd's TTLs are whole seconds: a TTL that rounds to the lease's keeps it.
  const auto seconds = [](Duration d) { return std::chrono::ceil<std::chrono::seconds>(d); };
  Impl& i = *impl_;
  MutexLock lock(&i.held_mu);
  if (seconds(ttl) != seconds(i.held_ttl)) {
    i.held_ttl = ttl;
    i.held_lease = 0;  // granted anew at the next beat; the old one expires unrenewed
  }
  if (i.held_key != key) {
    i.held_key = std::string(key);  // the earlier key stays on the lease until it ends
    i.held_put = false;
  }
  return Status::Ok();
}

int64_t EtcdStore::lease_id() const { return impl_->lease_id.load(); }

std::string EtcdStore::endpoint() const {
  return impl_->urls[impl_->current.load() % impl_->urls.size()];
}

Result<std::vector<bool>> EtcdStore::Silent(const std::vector<std::string>& keys,
                                            Duration quiet_for, Deadline deadline) {
  auto cannot = [&] {
    return FailedPrecondition("this etcd client has no answer from {:.1f} s ago to date writes by",
                              std::chrono::duration<double>(quiet_for).count());
  };
  int64_t then = impl_->revisions.ReachedBy(SteadyClock::now() - quiet_for);
  // A client younger than `quiet_for` still dates a key written after its earliest answer:
  // written since (a young rendezvous round's keys, all written after the client joined).
  const int64_t since = then != 0 ? then : impl_->revisions.Earliest();
  if (since == 0) return cannot();
  COHORT_ASSIGN_OR_RETURN(std::vector<json> kvs,
                          impl_->ReadKvs(keys, /*keys_only=*/true, deadline));
  std::vector<bool> silent;
  silent.reserve(kvs.size());
  for (const auto& kv : kvs) {
    const bool leased = !kv.is_null() && Int(kv, "lease") != 0;
    const bool before = !kv.is_null() && Int(kv, "mod_revision") <= since;
    if (then == 0 && before && !leased) return cannot();  // written before the earliest answer
    silent.push_back(kv.is_null() || (!leased && before));
  }
  return silent;
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

Result<bool> EtcdStore::CreateAll(const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values, Deadline deadline) {
  if (keys.size() != values.size() || keys.empty()) {
    return InvalidArgument("{} keys and {} values to create", keys.size(), values.size());
  }
  json compare = json::array(), success = json::array(), failure = json::array();
  for (size_t n = 0; n < keys.size(); ++n) {
    const std::string k = B64(impl_->Full(keys[n]));
    compare.push_back(AbsentCompare(k));
    success.push_back({{"request_put", {{"key", k}, {"value", B64(values[n])}}}});
    failure.push_back({{"request_range", {{"key", k}}}});
  }
  json txn = {{"compare", compare}, {"success", success}, {"failure", failure}};
  COHORT_ASSIGN_OR_RETURN(json r, impl_->Post("/v3/kv/txn", txn, deadline));
  if (r.value("succeeded", false)) return true;
  if (!r.contains("responses") || r["responses"].size() != keys.size()) {
    return DataLoss("etcd txn failed without a range response per key");
  }
  for (size_t n = 0; n < keys.size(); ++n) {
    COHORT_ASSIGN_OR_RETURN(auto now,
                            RangeValue(r["responses"][n].value("response_range", json::object())));
    if (now != values[n]) return false;
  }
  return true;  // written already with these values: an earlier copy of this call
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
  const auto called = SteadyClock::now();
  json reads = json::array();
  for (const auto& k : peek_keys) reads.push_back({{"request_range", {{"key", B64(i.Full(k))}}}});
  for (const auto& k : wait_keys) reads.push_back({{"request_range", {{"key", B64(i.Full(k))}}}});
  json r;
  bool put = !beat_key.empty();  // the answer's first response is the beat's put
  if (beat_key.empty()) {
    COHORT_ASSIGN_OR_RETURN(r, i.Post("/v3/kv/txn", {{"success", reads}}, deadline));
  } else if (const std::string key(beat_key); i.Held(key)) {
    COHORT_ASSIGN_OR_RETURN(r, i.LeasedBeat(key, reads, deadline, &put));
  } else {
    COHORT_ASSIGN_OR_RETURN(r, i.BeatTxn(key, reads, deadline));
  }
  const json& responses = r.contains("responses") ? r["responses"] : json::array();
  const size_t first = put ? 1 : 0;
  if (responses.size() != first + reads.size()) {
    return DataLoss("etcd beat txn answered {} ops, not {}", responses.size(),
                    first + reads.size());
  }
  // Each op's range response, by reference (a copy per read was the JSON of every kv).
  static const json kNoRange = json::object();
  auto range_of = [&](size_t op) -> const json& {
    const json& response = responses[first + op];
    auto it = response.find("response_range");
    return it == response.end() ? kNoRange : *it;
  };
  auto value_of = [&](size_t op) { return RangeValue(range_of(op)); };
  BeatResult out;
  out.revision = HeaderRevision(r);
  for (size_t k = 0; k < peek_keys.size(); ++k) {
    COHORT_ASSIGN_OR_RETURN(auto v, value_of(k));
    out.peeked.push_back(std::move(v));
    // The peeked key's last write, dated by this client's answers around its revision.
    const json* kv = FirstKv(range_of(k));
    const auto written = kv ? i.revisions.DateOf(Int(*kv, "mod_revision")) : std::nullopt;
    out.peeked_age_ms.push_back(
        written ? std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                           called - *written)
                                           .count())
                : -1);
  }
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
