// Backoff: the growing pause between tries of something that may succeed later (a refused
// connection, a name not yet in DNS, an unreachable etcd member, an engine polled for a job's
// state). Each pause doubles from `first` up to `max` and never reaches past the deadline.
// Callers that must stay interruptible wait Next() on their own fd or condition variable;
// the others call Sleep().
//
// Thread-safety: a value owned by one thread.
#pragma once

#include <algorithm>
#include <thread>

#include "cohort/base/time.h"

namespace cohort {

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
