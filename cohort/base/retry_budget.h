// RetryBudget: how many requests a client may send again, as a share of the requests it sends
// the first time (a token bucket). Each first try adds `ratio` tokens, time adds `per_second`
// (so that a client with little traffic can still fail over) and each answer one (the server
// answers again: the requests held back may go, at the pace it answers), up to `max_tokens`;
// each retry takes one. With no token left, a retry waits until there is one: when a server slows down
// and requests time out, its clients send at most `ratio` of their traffic again instead of a
// multiple of it, and the slow server is not held down by its own clients' retries (a
// metastable retry storm). LatencyTracker keeps a moving average of how long answers take, so
// that pauses grow with the server's observed latency rather than from fixed numbers.
//
// Thread-safety: both classes are safe to share between threads (one mutex each).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cohort/base/mutex.h"
#include "cohort/base/time.h"

namespace cohort {

class RetryBudget {
 public:
  struct Options {
    double ratio = 0.2;       // tokens a first try adds: retries <= 20 % of first tries
    double per_second = 0.5;  // tokens time adds
    double max_tokens = 10;   // what a quiet client has saved (it starts full)
  };
  explicit RetryBudget(Options options, SteadyClock::time_point now = SteadyClock::now())
      : o_(options), tokens_(options.max_tokens), at_(now) {}

  void OnFirstTry(SteadyClock::time_point now = SteadyClock::now()) {
    MutexLock lock(&mu_);
    Refill(now);
    tokens_ = std::min(o_.max_tokens, tokens_ + o_.ratio);
  }
  // An answer came back: one token.
  void OnAnswer(SteadyClock::time_point now = SteadyClock::now()) {
    MutexLock lock(&mu_);
    Refill(now);
    tokens_ = std::min(o_.max_tokens, tokens_ + 1);
  }
  // Takes a token for a retry: zero when there was one; else how long until time alone
  // adds one (the caller waits at most that long, then asks again: an answer may add one
  // sooner), and the retry counts as held back.
  Duration Take(SteadyClock::time_point now = SteadyClock::now()) {
    MutexLock lock(&mu_);
    Refill(now);
    if (tokens_ >= 1) {
      tokens_ -= 1;
      return Duration::zero();
    }
    ++held_;
    const double seconds = o_.per_second > 0 ? (1 - tokens_) / o_.per_second : 1.0;
    return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
  }
  // Retries that had to wait for a token so far.
  int64_t held() const {
    MutexLock lock(&mu_);
    return held_;
  }

 private:
  void Refill(SteadyClock::time_point now) COHORT_REQUIRES(mu_) {
    if (now <= at_) return;
    const double dt = std::chrono::duration<double>(now - at_).count();
    tokens_ = std::min(o_.max_tokens, tokens_ + dt * o_.per_second);
    at_ = now;
  }

  const Options o_;
  mutable Mutex mu_;
  double tokens_ COHORT_GUARDED_BY(mu_);
  SteadyClock::time_point at_ COHORT_GUARDED_BY(mu_);
  int64_t held_ COHORT_GUARDED_BY(mu_) = 0;
};

// A moving average of answer times (each new one weighs 1/8), zero before the first.
class LatencyTracker {
 public:
  void Add(Duration d) {
    MutexLock lock(&mu_);
    average_ = average_ == Duration::zero() ? d : average_ + (d - average_) / 8;
  }
  Duration average() const {
    MutexLock lock(&mu_);
    return average_;
  }

 private:
  mutable Mutex mu_;
  Duration average_ COHORT_GUARDED_BY(mu_) = Duration::zero();
};

}  // namespace cohort
