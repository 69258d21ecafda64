// Test helper (rendezvous_test.cc, rendezvous_carry_test.cc): EarlyTimeouts, a store
// wrapper that times requests out as a loaded etcd does (below).
// Thread-safety: as the Store it wraps; its injection state is guarded by a mutex.
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/store/store.h"

namespace cohort::rendezvous::testing {

// A store whose blocking reads time out long before the caller's deadline (as a loaded
// etcd does with its own request timeout): every waiting MultiGet and Wait answers
// DEADLINE_EXCEEDED after 20 ms. Counts the reads of more than two keys (the N records).
// With TimeOutOnce(keys): on each thread, the first CompareSet of such a key and the first
// Peek that reads one time out without being applied (requests etcd did not answer within
// its timeout). With LoseAnswerOnce(keys): on each thread, the first CompareSet of such a
// key is applied and then times out (a request etcd applied but whose answer came too
// late). With OfferIdle(): it offers Idle (waits until the deadline), as etcd does: rounds
// go quiet. With SlowBeats(d): every beat answers d late. Counts the Gets (and so the
// default GetSince's waits) of the key CountGets names. With GatherCompareSets(key, n): the
// first n CompareSets of `key` are held until all n have come (up to 10 s, past their
// deadlines: the store still holds the value each compares with), then applied in turn: n
// nodes changing it at once; `gathered` says whether they met.
class EarlyTimeouts final : public store::Store {
 public:
  explicit EarlyTimeouts(std::shared_ptr<store::Store> base) : base_(std::move(base)) {}
  std::atomic<int> record_reads{0};
  std::atomic<int> injected{0};
  void TimeOutOnce(std::set<std::string> keys) {
    MutexLock lock(&mu_);
    time_out_once_ = std::move(keys);
  }
  void LoseAnswerOnce(std::set<std::string> keys) {
    MutexLock lock(&mu_);
    lose_answer_once_ = std::move(keys);
  }
  void OfferIdle() { offer_idle_ = true; }
  std::atomic<bool> gathered{false};
  void GatherCompareSets(std::string key, int n) {
    MutexLock lock(&mu_);
    gather_key_ = std::move(key);
    gather_left_ = n;
  }
  // Every beat answered `d` late (a store that applies beats slowly); 0: at once.
  void SlowBeats(Duration d) { slow_beats_ns_ = d.count(); }
  Result<BeatResult> Beat(std::string_view beat_key, const std::vector<std::string>& peek_keys,
                          const std::vector<std::string>& wait_keys, Deadline d) override {
    const Duration slow{slow_beats_ns_.load()};
    if (slow > Duration{}) {
      std::this_thread::sleep_for(std::min(slow, d.remaining()));
      if (d.expired()) return DeadlineExceeded("injected: a slow beat");
    }
    return store::Store::Beat(beat_key, peek_keys, wait_keys, d);
  }
  Status Idle(Deadline d) override {
    if (!offer_idle_) return store::Store::Idle(d);
    std::this_thread::sleep_for(d.remaining());  // what Idle is: no request, no wake-up
    return Status::Ok();
  }

  Status Set(std::string_view k, std::string_view v, Deadline d) override {
    return base_->Set(k, v, d);
  }
  void CountGets(std::string key) {
    MutexLock lock(&mu_);
    counted_key_ = std::move(key);
  }
  std::atomic<int> counted_gets{0};
  Result<std::string> Get(std::string_view k, Deadline d) override {
    {
      MutexLock lock(&mu_);
      if (k == counted_key_) ++counted_gets;
    }
    return base_->Get(k, Soon(d));
  }
  Result<int64_t> Add(std::string_view k, int64_t delta, Deadline d) override {
    return base_->Add(k, delta, d);
  }
  Result<std::string> CompareSet(std::string_view k, std::string_view e, std::string_view v,
                                 Deadline d) override {
    if (FirstTimeHere("CompareSet", {std::string(k)})) return DeadlineExceeded("injected: {}", k);
    Gather(k);
    auto answer = base_->CompareSet(k, e, v, d);
    if (FirstTimeHere("CompareSet", {std::string(k)}, /*after_applying=*/true)) {
      return DeadlineExceeded("injected after applying: {}", k);
    }
    return answer;
  }
  Status Wait(const std::vector<std::string>& keys, Deadline d) override {
    return base_->Wait(keys, Soon(d));
  }
  Result<bool> Check(const std::vector<std::string>& keys, Deadline d) override {
    return base_->Check(keys, d);
  }
  Result<std::vector<std::optional<std::string>>> Peek(const std::vector<std::string>& keys,
                                                       Deadline d) override {
    if (FirstTimeHere("Peek", keys)) return DeadlineExceeded("injected: {}", keys[0]);
    return base_->Peek(keys, d);
  }
  Result<bool> Delete(std::string_view k, Deadline d) override { return base_->Delete(k, d); }
  Result<int64_t> NumKeys(Deadline d) override { return base_->NumKeys(d); }
  Result<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                            Deadline d) override {
    if (keys.size() > 2) ++record_reads;
    return base_->MultiGet(keys, Soon(d));
  }
  Status MultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                  Deadline d) override {
    return base_->MultiSet(keys, values, d);
  }
  // Dated by the base store (CreateAll stays the default here: through CompareSet above).
  Result<std::vector<bool>> Silent(const std::vector<std::string>& keys, Duration quiet_for,
                                   Deadline d) override {
    return base_->Silent(keys, quiet_for, d);
  }
  void Abort() override { base_->Abort(); }

 private:
  static Deadline Soon(Deadline d) { return d.Earlier(Deadline::AfterMs(20)); }
  // Whether `op` of one of `keys` is to time out once on this thread (before it is applied,
  // or after), and has not yet.
  bool FirstTimeHere(const char* op, const std::vector<std::string>& keys,
                     bool after_applying = false) {
    MutexLock lock(&mu_);
    const auto& once = after_applying ? lose_answer_once_ : time_out_once_;
    const std::string tag = std::string(op) + (after_applying ? " applied " : " ");
    for (const auto& k : keys) {
      if (once.count(k) && done_.insert({std::this_thread::get_id(), tag + k}).second) {
        ++injected;
        return true;
      }
    }
    return false;
  }
  // Holds a CompareSet of the gathered key until the last of the n comes (10 s at most).
  void Gather(std::string_view k) {
    MutexLock lock(&mu_);
    if (gather_left_ == 0 || k != gather_key_) return;
    if (--gather_left_ == 0) {
      gathered = gather_waiting_ > 0;
      all_came_.SignalAll();
      return;
    }
    ++gather_waiting_;
    const Deadline limit = Deadline::AfterMs(10000);
    while (gather_left_ > 0 && all_came_.WaitUntil(&mu_, limit)) {
    }
    --gather_waiting_;
  }
  std::atomic<bool> offer_idle_{false};
  std::string gather_key_ COHORT_GUARDED_BY(mu_);
  int gather_left_ COHORT_GUARDED_BY(mu_) = 0;
  int gather_waiting_ COHORT_GUARDED_BY(mu_) = 0;
  CondVar all_came_;
  std::atomic<int64_t> slow_beats_ns_{0};
  Mutex mu_;
  std::set<std::string> time_out_once_ COHORT_GUARDED_BY(mu_);
  std::set<std::string> lose_answer_once_ COHORT_GUARDED_BY(mu_);
  std::string counted_key_ COHORT_GUARDED_BY(mu_);
  std::set<std::pair<std::thread::id, std::string>> done_ COHORT_GUARDED_BY(mu_);
  std::shared_ptr<store::Store> base_;
};

}  // namespace cohort::rendezvous::testing
