// EtcdStore::Await (etcd_store.h): a watch held open between calls, so that a node resting
// between its beats is told of a key's put at once for one request per watch (a quiet
// round's end at 10,000 nodes, where a watch per beat period cost etcd more than it could
// give; docs/scale.md). The stream is a POST to the gateway's /v3/watch on a connection of
// its own, driven by a libcurl multi handle: a call serves it until its deadline and leaves
// it open (unserviced; etcd's events wait in the socket) for the next call.
//
// Thread-safety: Impl::held_watch belongs to Await's caller (one at a time). Abort() from
// another thread shuts the stream's socket down (it was opened through OpenSocket, so it is
// in Impl::fds), which ends the transfer and so the call (kCancelled).
#include <curl/curl.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cohort/base/log.h"
#include "cohort/store/etcd_store_internal.h"

namespace cohort::store {
namespace etcd {

HeldWatch::~HeldWatch() {
  if (multi != nullptr) {
    curl_multi_remove_handle(multi, conn->curl);
    curl_multi_cleanup(multi);
  }
  if (conn) curl_easy_setopt(conn->curl, CURLOPT_HTTPHEADER, nullptr);
  conn.reset();
  curl_slist_free_all(headers);
}

}  // namespace etcd

using namespace etcd;  // NOLINT: EtcdStore's shared helpers (etcd_store_internal.h)

std::unique_ptr<HeldWatch> EtcdStore::Impl::HoldWatch(const std::string& full_key,
                                                      int64_t since) {
  auto h = std::make_unique<HeldWatch>();
  h->full_key = full_key;
  h->b64_key = B64(full_key);
  h->since = since;
  h->member = current.load() % urls.size();
  h->body = json{{"create_request",
                  {{"key", h->b64_key}, {"start_revision", std::to_string(since + 1)}}}}
                .dump();
  h->conn = NewConn();
  HeldWatch* w = h.get();
  h->conn->on_line = [this, w](std::string_view line) {
    bool bad_token = false;
    auto res = WatchResult(line, &bad_token);
    if (!res.ok()) {
      w->ended = bad_token ? PermissionDenied("etcd: invalid auth token") : res.status();
      return false;
    }
    if (res->is_null()) return true;
    revisions.Note(SteadyClock::now(), HeaderRevision(*res));  // a later answer than any
    if (res->value("canceled", false)) {
      w->ended = Unavailable("etcd cancelled the watch of '{}' ({})", w->full_key,
                             res->value("cancel_reason", std::string("no reason given")));
      return false;
    }
    w->found = PutIn(*res, w->b64_key);
    return !w->found;
  };
  // No timeout on the transfer: each call bounds its own wait.
  h->headers = Prepare(*h->conn, urls[h->member] + "/v3/watch", h->body, Duration::max(),
                       options.request_timeout, /*with_token=*/true, /*require_leader=*/true);
  h->multi = curl_multi_init();
  COHORT_CHECK(h->multi != nullptr) << "curl_multi_init failed";
  curl_multi_add_handle(h->multi, h->conn->curl);
  return h;
}

Result<std::optional<std::string>> EtcdStore::Impl::ServeHeld(Deadline deadline) {
  HeldWatch& h = *held_watch;
  for (;;) {
    int running = 0;
    const CURLMcode mc = curl_multi_perform(h.multi, &running);
    if (h.found) {
      std::optional<std::string> value = std::move(h.found);
      held_watch.reset();
      return value;
    }
    if (aborted) {
      held_watch.reset();
      return Cancelled("etcd store client aborted");
    }
    if (mc != CURLM_OK || running == 0) break;
    if (deadline.expired()) return std::optional<std::string>();
    const int64_t left_ms =
        std::chrono::ceil<std::chrono::milliseconds>(deadline.remaining()).count();
    curl_multi_poll(h.multi, nullptr, 0, static_cast<int>(std::clamp<int64_t>(left_ms, 1, 1000)),
                    nullptr);
  }
  // etcd ended the stream (its member went away, lost its leader, or compacted the
  // revision): drop it, let the next call open one on the next member, and rest until the
  // deadline, as a store without held waits would (the caller's reads still see the key).
  std::string why = h.ended.ok() ? std::string("the stream closed") : h.ended.ToString();
  if (h.ended.ok()) {
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(h.multi, &left)) {
      if (m->msg == CURLMSG_DONE) why = curl_easy_strerror(m->data.result);
    }
  }
  const bool bad_token = h.ended.code() == StatusCode::kPermissionDenied;
  COHORT_LOG_DEBUG(kLog, "held watch of '{}' on {} ended: {}", h.full_key, urls[h.member], why);
  Rotate(h.member);
  held_watch.reset();
  if (bad_token && !options.user.empty()) (void)Authenticate(deadline);
  Pause(deadline.remaining(), deadline);
  if (aborted) return Cancelled("etcd store client aborted");
  return std::optional<std::string>();
}

Result<std::optional<std::string>> EtcdStore::Await(std::string_view key, int64_t since,
                                                    Deadline deadline) {
  Impl& i = *impl_;
  if (since <= 0) {
    return FailedPrecondition("a held wait starts after a revision the key was read at, not {}",
                              since);
  }
  const std::string full = i.Full(key);
  if (i.held_watch && (i.held_watch->full_key != full || i.held_watch->since > since)) {
    i.held_watch.reset();
  }
  if (!i.held_watch) i.held_watch = i.HoldWatch(full, since);
  return i.ServeHeld(deadline);
}

}  // namespace cohort::store
