// EtcdStore's tickets and beats (etcd_store_internal.h): the ticket txn behind TakeTicket,
// Append and Join (one txn per ticket, idempotent when sent again), the tickets' records in
// ticket order (ReadAppended), and the beat txn behind Beat (a counter's compare-and-put
// with the step's reads).
//
// Thread-safety: every function here may be called from any thread at once; the beat
// counters this client last wrote or read are guarded by beat_mu.
#include <algorithm>
#include <optional>
#include <nlohmann/json.hpp>

#include "cohort/base/backoff.h"
#include "cohort/base/mutex.h"
#include "cohort/base/strings.h"
#include "cohort/store/etcd_store_internal.h"

namespace cohort::store {

using namespace etcd;  // NOLINT: EtcdStore's shared helpers (etcd_store_internal.h)

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
Result<EtcdStore::Impl::TicketAnswer> EtcdStore::Impl::TicketTxn(
    std::string_view key, std::string_view record, const std::vector<std::string>& unless,
    const std::vector<std::string>& reads, Deadline deadline, std::string_view token) {
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
  TicketAnswer out;
  std::optional<json> marker_kv;  // this call's marker, when an earlier copy was applied
  while (!marker_kv) {
    auto sent = Post("/v3/kv/txn", txn, deadline, true, Resend::kUntilPending);
    if (sent.ok()) {
      const json& r = *sent;
      const json& responses = r.contains("responses") ? r["responses"] : json::array();
      const bool succeeded = r.value("succeeded", false);
      const size_t ops = succeeded ? 2 + reads.size() : 1;
      if (responses.size() != ops) {
        return DataLoss("etcd ticket txn answered {} ops, not {}", responses.size(), ops);
      }
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
      const json* kv = FirstKv(marker_range);
      if (kv == nullptr) return out;  // refused: an `unless` key exists
      marker_kv = *kv;
      continue;
    }
    if (!ProposalPending(sent.status())) return sent.status();
    // etcd took the txn but did not apply it in time: it is most likely applied later, and a
    // copy sent now would be a second proposal that etcd applies too (at 10,000 nodes half
    // the joins' first txns timed out so). Wait this client's share of the peers' pace,
    // then look for the marker: a read is answered once etcd applied what it had committed.
    Pause(Jittered(OverloadPause(Resend::kUntilPending)), deadline);
    COHORT_ASSIGN_OR_RETURN(
        json found, Post("/v3/kv/range", {{"key", marker}}, deadline, true, Resend::kUntilDeadline));
    if (const json* kv = FirstKv(found)) {
      marker_kv = *kv;
      out.revision = Int(*kv, "create_revision");  // the applied txn's own revision
    }
  }
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
Result<std::vector<std::string>> EtcdStore::Impl::TicketRecords(std::string_view key,
                                                                int64_t first, int64_t last,
                                                                Deadline deadline) {
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
Result<json> EtcdStore::Impl::BeatTxn(const std::string& beat_key, const json& reads,
                                      Deadline deadline) {
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

}  // namespace cohort::store
