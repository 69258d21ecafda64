// What rendezvous.cc (rounds: joins, ends, the job's end), rendezvous_watch.cc (liveness:
// heartbeats and dead-node detection) and rendezvous_carry.cc (carried rounds) share: the
// log channel, the test for a store call that timed out, store calls made again until a
// deadline, a quiet round's dead timeout and the parse of a counter and of the restart count.
// Internal to the rendezvous: include it from those files only.
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "cohort/base/backoff.h"
#include "cohort/base/status.h"
#include "cohort/base/strings.h"
#include "cohort/base/time.h"
#include "cohort/rendezvous/rendezvous.h"

namespace cohort::rendezvous {

inline constexpr const char* kLog = "rdzv";

// The level of a line that says how long an end took: a warning past a second (every node
// of the round waits that long), else info.
inline spdlog::level::level_enum LevelOfEndTaking(double seconds) {
  return seconds > 1.0 ? spdlog::level::warn : spdlog::level::info;
}

inline bool IsTimeout(const Status& s) { return s.code() == StatusCode::kDeadlineExceeded; }
template <typename T>
bool IsTimeout(const Result<T>& r) {
  return !r.ok() && IsTimeout(r.status());
}

// Per-call deadline for non-blocking store calls.
inline constexpr auto kCallTimeout = std::chrono::seconds(30);

// Runs a blocking store call until it does not time out or `deadline` has really passed: a
// loaded store (etcd) times single requests out long before a join's deadline, and taking
// that for the deadline made every node of a 5,000-node round take over from slot 1.
template <typename Call>
auto UntilDeadline(Deadline deadline, const Call& call) -> decltype(call()) {
  Backoff backoff(std::chrono::milliseconds(50), std::chrono::seconds(1), deadline);
  for (;;) {
    auto result = call();
    if (!IsTimeout(result) || deadline.expired() || !backoff.Sleep()) return result;
  }
}

// The same for a request that may be repeated (a read, a compare-and-set from absent), not
// a wait: call(d) gets each attempt's deadline, one call's timeout from then at most.
template <typename Call>
auto RequestUntilDeadline(Deadline deadline, const Call& call) -> decltype(call(deadline)) {
  return UntilDeadline(deadline,
                       [&] { return call(Deadline::After(kCallTimeout).Earlier(deadline)); });
}

// The dead timeout of a quiet round of `n` nodes: its beats stay within quiet_beats_per_s,
// so its beat period is at least n / that rate, and the dead timeout four periods at least.
inline Duration QuietDeadTimeout(const RendezvousConfig& c, int n) {
  if (c.quiet_beats_per_s <= 0) return c.dead_timeout;
  const auto period = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(double(n) / c.quiet_beats_per_s));
  return std::max(c.dead_timeout, 4 * period);
}

// The beat period of a round of `n` nodes beating counters, at pace 1 (Rendezvous::BeatPeriod
// without a will or a lease, from the configuration alone): a quarter of its dead timeout,
// at least the heartbeat interval.
inline Duration CounterBeatPeriod(const RendezvousConfig& c, int n) {
  const Duration dead = n >= c.quiet_start_nodes ? QuietDeadTimeout(c, n) : c.dead_timeout;
  return std::max(c.heartbeat_interval, dead / 4);
}

// The largest pace of a quiet round (Rendezvous::FollowPace).
constexpr int64_t kMaxPace = 16;

// r<R>/pace's text as a pace (nullopt: not a number from 1 to kMaxPace). The text is
// "K by slot S": the pace and the slot of the setter that wrote it (PaceText), so that of
// two setters changing it at once only the one whose compare-and-set wrote it says so; a
// bare "K" reads too.
inline std::optional<int64_t> ParsePace(std::string_view text) {
  auto pace = ParseInt64(text.substr(0, text.find(' ')));
  if (!pace || *pace < 1 || *pace > kMaxPace) return std::nullopt;
  return pace;
}
inline std::string PaceText(int64_t pace, int slot) {
  return fmt::format("{} by slot {}", pace, slot);
}

// A rendezvous counter's value as read (absent = 0).
inline Result<int64_t> ParseCounter(const std::optional<std::string>& v, std::string_view name) {
  if (!v) return int64_t{0};
  auto n = ParseInt64(*v);
  if (!n) return DataLoss("rendezvous counter '{}' holds '{}', not a number", name, *v);
  return *n;
}

// The job-wide restart count (key `restarts`): "N@R", N failures counted, the last by the
// end of round R; absent, none. CountRestart counts each round's end once, whoever writes
// it: a node that took over a stale claim (EndRoundThen) finds the count of the winner
// that died after counting. (A bare "N" is read as N counted by no round.)
struct RestartCount {
  int64_t count = 0;
  int64_t round = -1;  // the round whose end counted last (-1: none known)

  std::string Encode() const { return std::to_string(count) + "@" + std::to_string(round); }
  static Result<RestartCount> Parse(const std::optional<std::string>& v) {
    if (!v) return RestartCount{};
    const auto at = v->find('@');
    auto count = ParseInt64(std::string_view(*v).substr(0, at));
    auto round = at == std::string::npos ? std::optional<int64_t>(-1)
                                         : ParseInt64(std::string_view(*v).substr(at + 1));
    if (!count || !round) {
      return DataLoss("the rendezvous restart count holds '{}', not N@round", *v);
    }
    return RestartCount{*count, *round};
  }
};

// The restart count's N as read.
inline Result<int64_t> ParseRestarts(const std::optional<std::string>& v) {
  COHORT_ASSIGN_OR_RETURN(RestartCount c, RestartCount::Parse(v));
  return c.count;
}

}  // namespace cohort::rendezvous
