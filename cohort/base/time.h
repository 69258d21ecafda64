// Clocks and deadlines. Every blocking call in cohort takes a Deadline: an absolute
// point on the steady clock. Deadline::Infinite() is only for loops that are woken
// by something else (an abort or a signal).
//
// Thread-safety: value types.
#pragma once

#include <chrono>
#include <cstdint>

namespace cohort {

using SteadyClock = std::chrono::steady_clock;
using Duration = std::chrono::nanoseconds;

class Deadline {
 public:
  static Deadline After(Duration d) { return Deadline(SteadyClock::now() + d); }
  static Deadline AfterMs(int64_t ms) { return After(std::chrono::milliseconds(ms)); }
  static Deadline At(SteadyClock::time_point t) { return Deadline(t); }
  static Deadline Infinite() { return Deadline(SteadyClock::time_point::max()); }

  SteadyClock::time_point time() const { return time_; }
  bool infinite() const { return time_ == SteadyClock::time_point::max(); }
  bool expired() const { return !infinite() && SteadyClock::now() >= time_; }
  Duration remaining() const {
    if (infinite()) return Duration::max();
    auto left = time_ - SteadyClock::now();
    return left < Duration::zero() ? Duration::zero() : left;
  }
  // Remaining time in milliseconds for poll(2): -1 when infinite, rounded up otherwise.
  int PollTimeoutMs() const {
    if (infinite()) return -1;
    auto left = remaining();
    int64_t ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    return ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms);
  }
  int64_t RemainingMs() const {
    if (infinite()) return INT64_MAX;
    return std::chrono::ceil<std::chrono::milliseconds>(remaining()).count();
  }
  Deadline Earlier(Deadline other) const { return time_ < other.time_ ? *this : other; }

 private:
  explicit Deadline(SteadyClock::time_point t) : time_(t) {}
  SteadyClock::time_point time_;
};

inline double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// Wall clock in seconds since the epoch (for logs and records that cross processes).
inline double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace cohort
