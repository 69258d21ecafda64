// What rendezvous.cc (rounds: joins, ends, the job's end) and rendezvous_watch.cc (liveness:
// heartbeats and dead-node detection) share: the log channel and the test for a store call
// that timed out. Internal to the rendezvous: include it from those files only.
// Thread-safety: pure functions.
#pragma once

#include "cohort/base/status.h"

namespace cohort::rendezvous {

inline constexpr const char* kLog = "rdzv";

inline bool IsTimeout(const Status& s) { return s.code() == StatusCode::kDeadlineExceeded; }
template <typename T>
bool IsTimeout(const Result<T>& r) {
  return !r.ok() && IsTimeout(r.status());
}

}  // namespace cohort::rendezvous
