// Backoff: the growing pause between tries of something that may succeed later (a refused
// connection, a name not yet in DNS, an unreachable etcd member, an engine polled for a job's
// state). Each pause doubles from `first` up to `max` and never reaches past the deadline.
// Callers that must stay interruptible wait Next() on their own fd or condition variable;
// the others call Sleep(). RandomUnit, Jittered and NextJittered draw the jitter that spreads many
// clients' retries.
//
// Thread-safety: a Backoff is a value owned by one thread; RandomUnit keeps one engine per
// thread.
#pragma once

#include <algorithm>
#include <functional>
#include <random>
#include <thread>

#include "cohort/base/time.h"

namespace cohort {

// Uniform in [0, 1), from a per-thread engine (seeded from the clock and the thread: the
// jitter it draws needs no cryptographic seed, and thousands of threads start at once).
inline double RandomUnit() {
  thread_local std::mt19937_64 engine{
      static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count()) ^
      std::hash<std::thread::id>()(std::this_thread::get_id())};
  return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
}

// `pause` at a random 50-100% of it: many clients waiting out the same overloaded service
// do not all come back at once.
inline Duration Jittered(Duration pause) {
  return std::chrono::duration_cast<Duration>(pause * (0.5 + 0.5 * RandomUnit()));
}

class Backoff {
 public:
  Backoff(Duration first, Duration max, Deadline deadline = Deadline::Infinite())
      : first_(first), max_(max), next_(first), deadline_(deadline) {}

  // The pause before the next try (zero once the deadline has passed); the one after it
  // is twice as long, up to the maximum.
  Duration Next() {
    const Duration pause = std::min(next_, deadline_.remaining());
    next_ = std::min(next_ * 2, max_);
    return pause;
  }
  // The next pause, Jittered.
  Duration NextJittered() { return Jittered(Next()); }
  // Sleeps the next pause. False when the deadline has passed: no more tries.
  bool Sleep() {
    if (deadline_.expired()) return false;
    std::this_thread::sleep_for(Next());
    return !deadline_.expired();
  }
  // Back to the first pause (after progress).
  void Reset() { next_ = first_; }

 private:
  Duration first_, max_, next_;
  Deadline deadline_;
};

}  // namespace cohort
