// Liveness of a running round (rendezvous.h): the watcher's steps (WatchStep: a beat, the
// watched peer's counter and will, the round's end), the ring of watched peers, the beat
// period and dead timeout (quiet rounds), a dead peer's end of the round, and a finished
// node's end of the job (MarkFinished, WaitForJobEnd).
// Thread-safety: see rendezvous.h (the watcher's Rendezvous is used by its thread only);
// this file keeps no global state.
#include "cohort/base/backoff.h"
#include "cohort/base/log.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/rendezvous/rendezvous_internal.h"

namespace cohort::rendezvous {

namespace {
// When the peer a watcher watches has finished, the watcher reads this many following
// slots at once to find the next one still running.
constexpr int kWatchWindow = 64;
// How long a watcher's step waits when it only reads a suspect peer's counter.
constexpr auto kLookNow = std::chrono::milliseconds(50);

double Seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

// The first step of a round on a store without wills (WatchStep).
Result<std::optional<RoundEnd>> Rendezvous::FirstStepWithoutWill(const RendezvousInfo& info,
                                                                 Deadline wake, double spread) {
  const int64_t round = info.round;
  // No beat yet (the watched peer is judged from the end of this step: it may not beat
  // before then either): the first beats of the nodes of a round that just closed would
  // compete with the joins still in flight. A large round's nodes do not even watch for
  // the round's end in this step, on a store where that is a request (etcd: thousands of
  // watches at once cost it more than the joins; docs/scale.md): the beat that ends the
  // step reads `next`, so a round that ends this early is learned up to a period late
  // (unless it is told: RestIdle).
  if (quiet_) {
    auto rested = RestIdle(info, wake);
    if (rested.ok() && *rested) return rested;
    Status idle = rested.status();
    if (idle.ok()) {
      if (info.slot == 1 && DeadTimeout(info) > config_.dead_timeout) {
        COHORT_LOG_WARN(kLog,
                        "round {}: {} nodes beat every {:.1f} s (at most {} beats a second "
                        "in all{}), so a silent node is found after {:.0f} s, not the dead "
                        "timeout of {:.0f} s",
                        round, info.group_world_size, Seconds(BeatPeriod(info)),
                        config_.quiet_beats_per_s,
                        pace_ > 1 ? fmt::format(", divided by the round's pace {}", pace_) : "",
                        Seconds(DeadTimeout(info)), Seconds(config_.dead_timeout));
      }
      watched_change_ = SteadyClock::now();
      return std::optional<RoundEnd>();
    }
    if (idle.code() != StatusCode::kFailedPrecondition) return idle;
    quiet_ = false;  // the store offers no idle wait: an ordinary round
    quiet_period_ = Duration{};
    wake = Deadline::After(std::chrono::duration_cast<Duration>(BeatPeriod(info) * spread));
  }
  // Else: wait for the round's end, from the moment this node joined (etcd: one watch,
  // where a beat is a txn and a watch).
  int64_t since = info.joined_at;
  auto ended = store_->GetSince(RoundKey(round, "next"), &since, wake);
  // The watched peer's silence counts from here, as it too may not beat before now.
  watched_change_ = SteadyClock::now();
  if (IsTimeout(ended)) return std::optional<RoundEnd>();
  COHORT_ASSIGN_OR_RETURN(std::string next, std::move(ended));
  return std::optional<RoundEnd>(RoundEnd::Decode(next));
}

// The watched peer `silent` (its slot) is taken for dead: the round ends, its next read.
Result<std::optional<RoundEnd>> Rendezvous::DeclarePeerDead(const RendezvousInfo& info,
                                                            int silent,
                                                            const std::optional<std::string>& gone) {
  const int64_t round = info.round;
  const std::string host = PeerHost(info, silent);
  RoundEnd dead{RoundEnd::Kind::kDeadNode,
                gone ? fmt::format("node {} ({}): {}", silent - 1, host, *gone)
                     : fmt::format("node {} ({}) stopped sending heartbeats", silent - 1, host)};
  COHORT_LOG_WARN(kLog, "round {}: {}", round, dead.detail);
  FailureRecord record;
  record.host = host;
  record.message = dead.detail;
  COHORT_RETURN_IF_ERROR(EndRoundForLostNode(info, silent, dead, record).status());
  COHORT_ASSIGN_OR_RETURN(std::string next, store_->Get(RoundKey(round, "next"), CallDeadline()));
  return std::optional<RoundEnd>(RoundEnd::Decode(next));
}

// The first step of a round, before anything else: leaves this node's will (a node that
// dies in its first seconds is told by its will too; a store without wills says so once)
// and decides whether the round is quiet.
void Rendezvous::BeginWatchRound(const RendezvousInfo& info) {
  const int64_t round = info.round;
  first_step_round_ = round;
  will_left_ = info.group_world_size > 1 &&
               store_->LeaveWill(RoundKey(round, fmt::format("gone{}", info.slot)),
                                 LivenessPeriod(), CallDeadline())
                   .ok();
  // A large round on a store without wills may be quiet (WatchStep): its beat period is
  // then bounded by quiet_beats_per_s from the first step on (the first beats are spread
  // too).
  quiet_ = !will_left_ && info.group_world_size >= config_.quiet_start_nodes;
  pace_ = std::clamp<int64_t>(info.pace, 1, kMaxPace);
  pace_value_.clear();
  pace_seen_ = SteadyClock::now();
  calm_beats_ = 0;
  // Without a will, a lease where the store keeps them (etcd): the beats renew it instead
  // of writing a counter, and the store itself deletes a silent node's key. Not in a quiet
  // round: at 10,000 nodes on etcd, leases (each node's grant, then a renewal and a read
  // per step through the gateway) overloaded etcd right after round 0 in both runs tried,
  // where counter beats did not (docs/scale.md, 2026-12-06).
  leased_ = !will_left_ && !quiet_ && info.group_world_size > 1 &&
            store_->LeaseKey(RoundKey(round, fmt::format("hb{}", info.slot)),
                             config_.dead_timeout, CallDeadline())
                .ok();
}

// Liveness is a ring over the round's slots: each node watches one peer, its successor,
// and when that peer has finished, the next one still running (kWatchWindow slots read at
// once). Any silent node is watched by its nearest running predecessor. A step is one
// store call (Store::Beat: bump this node's counter, read the watched one's, wait for the
// round's end), so a step costs the store one request per node.
// When the store keeps wills (the embedded store), each node also leaves one on its
// watcher connection (r<R>/gone<S>, at its first step): a node whose process dies or
// whose host closes its sockets is known gone one liveness period after its connection
// ended, and its watcher is woken by it (the step waits for `next` or that key). The beats
// then only catch hung agents and silent hosts, so they come once per liveness period
// (dead timeout / 3). Without a will, once per dead timeout / 4 (BeatPeriod).
Result<std::optional<RoundEnd>> Rendezvous::WatchStep(const RendezvousInfo& info, bool beat) {
  const int64_t round = info.round;
  const bool watching = info.group_world_size > 1 && StartWatching(info);
  const auto now = SteadyClock::now();
  const bool first = first_step_round_ != round;
  if (first) BeginWatchRound(info);
  Duration period = BeatPeriod(info);
  if (first) quiet_period_ = quiet_ ? period : Duration{};
  // Every node starts watching when the round closes: spread their beats over the period
  // (the first step waits a random 10-100% of it) so that the store is not asked by all of
  // them in the same milliseconds every period. A carried round's nodes all learn its start
  // at once (the end of the round before, on a held wait): each beats where its beats of
  // that round would have come, so that they keep their phase and the store's beat rate
  // does not change across the carry.
  const double spread = 0.1 + 0.9 * RandomUnit();
  Deadline wake = Deadline::After(first ? std::chrono::duration_cast<Duration>(period * spread)
                                        : period);
  if (first && info.carried.records_round >= 0 && last_beat_ != SteadyClock::time_point{}) {
    auto at = last_beat_ + period;
    while (at < now) at += period;
    wake = Deadline::At(at);
  }
  if (first && !will_left_) return FirstStepWithoutWill(info, wake, spread);
  return BeatStep(info, beat, watching, now, wake);
}

// A step with a beat (every step but a first one without a will): one Store::Beat call
// that bumps this node's counter, reads the watched peer's and waits for the round's end
// (or the peer's will) until `wake`; then the peer is judged from what it read.
Result<std::optional<RoundEnd>> Rendezvous::BeatStep(const RendezvousInfo& info, bool beat,
                                                     bool watching, SteadyClock::time_point now,
                                                     Deadline wake) {
  const int64_t round = info.round;
  std::vector<std::string> peek;
  std::vector<std::string> wait = {RoundKey(round, "next")};
  if (watching) {
    peek.push_back(RoundKey(round, fmt::format("hb{}", watched_slot_)));
    if (will_left_) wait.push_back(RoundKey(round, fmt::format("gone{}", watched_slot_)));
    // Past the watched peer's deadline: look at once (its counter read by this call
    // decides); else wake when the deadline comes, if that is before the next beat.
    // (Never less than kLookNow: the store's answer must come before the call's deadline.)
    const auto due = watched_change_ + DeadTimeout(info);
    wake = wake.Earlier(Deadline::At(std::max(due + std::chrono::milliseconds(1), now + kLookNow)));
  }
  // A quiet round (see the first step) reads `next` with the beat and then rests until the
  // step's end on a wait for `next` that the store holds across the steps (Store::Await:
  // etcd, one watch for the round, opened at this first beat, where a watch per step cost
  // it more than it could give): one request per step, the round's end learned at once.
  // Where the round is told its end by datagram (tell_start_nodes), above
  // quiet_watch_max_nodes, or where the store holds no wait, it rests asking nothing
  // (RestIdle): told the end by datagram where the round is told, else learning it at the
  // next beat. (Told rounds held the watch too until 2026-12-06: at 5,000 nodes the watches
  // cost etcd 0.7 GB and made every end slower, docs/scale.md.) Otherwise the beat call
  // waits for `next` (and a will) itself.
  const size_t next_at = peek.size();
  const std::string next_key = wait[0];
  if (quiet_) {
    peek.push_back(next_key);
    peek.push_back(RoundKey(round, "pace"));  // at next_at + 1 (FollowPace)
    wait.clear();
  }
  int64_t read_at = 0;  // the store revision the beat read `next` absent at
  auto rest = [&]() -> Result<std::optional<RoundEnd>> {
    if (!quiet_) return std::optional<RoundEnd>();
    if (info.group_world_size <= config_.quiet_watch_max_nodes && !TellsEnd(info)) {
      auto ended = store_->Await(next_key, read_at, wake);
      if (ended.ok()) {
        if (awaited_round_ != round) {
          awaited_round_ = round;
          COHORT_LOG_INFO(kLog, "round {}: {} nodes, quiet: this node beats every {:.1f} s and "
                          "awaits the round's end on a watch held across its beats", round,
                          info.group_world_size, Seconds(BeatPeriod(info)));
        }
        if (!*ended) return std::optional<RoundEnd>();
        return std::optional<RoundEnd>(RoundEnd::Decode(**ended));
      }
      if (ended.status().code() != StatusCode::kFailedPrecondition) return ended.status();
    }
    return RestIdle(info, wake);
  };
  const auto sent = SteadyClock::now();
  auto beat_result =
      store_->Beat(beat ? RoundKey(round, fmt::format("hb{}", info.slot)) : std::string(), peek,
                   wait, wake);
  if (beat) last_beat_ = now;
  // An answer that came after the step's deadline (a loaded store or client) tells nothing
  // about the peer: judge it at the next step.
  if (IsTimeout(beat_result.status())) {
    if (quiet_) FollowPace(info, std::nullopt, Duration::max());
    return std::optional<RoundEnd>();
  }
  COHORT_ASSIGN_OR_RETURN(store::Store::BeatResult step, std::move(beat_result));
  read_at = step.revision;
  if (quiet_) {
    FollowPace(info, step.peeked[next_at + 1],
               std::chrono::duration_cast<Duration>(SteadyClock::now() - sent));
  }
  if (quiet_ && step.peeked[next_at]) {
    return std::optional<RoundEnd>(RoundEnd::Decode(*step.peeked[next_at]));
  }
  if (step.waited && step.waited_index == 0) {
    return std::optional<RoundEnd>(RoundEnd::Decode(*step.waited));
  }
  if (!watching) return rest();
  const std::optional<std::string> gone = step.waited;  // the watched peer's will, if set
  std::optional<std::string> peer_beat = std::move(step.peeked[0]);
  if (gone) {
    // The counter was read when the step began; the peer may have finished (and closed its
    // connection) since: read it again before taking the will for a death.
    COHORT_ASSIGN_OR_RETURN(auto now_beat, store_->Peek({peek[0]}, CallDeadline()));
    peer_beat = std::move(now_beat[0]);
  }
  COHORT_ASSIGN_OR_RETURN(int silent, JudgeWatchedPeer(info, peer_beat, step.peeked_age_ms[0],
                                                       gone.has_value(), now));
  if (silent == 0) return rest();
  return DeclarePeerDead(info, silent, gone);
}

// A quiet round's beats, N per beat period, stay within quiet_beats_per_s: its period is at
// least N / that rate, and the dead timeout at least four periods.
Duration Rendezvous::DeadTimeout(const RendezvousInfo& info) const {
  return quiet_ ? QuietDeadTimeout(config_, info.group_world_size) * pace_ : config_.dead_timeout;
}

// A quiet round's pace: its beat period and dead timeout are the configured ones times
// r<R>/pace (absent: 1), which every node reads with each beat. quiet_beats_per_s is what a
// store on its own cores applies; a slowed one (etcd on a fraction of a core, a member
// compacting, a noisy neighbour) may apply less, and then its queue grows, every answer
// comes later, and the beats it has not applied yet are taken for dead nodes (at 5,000
// nodes on etcd limited to one core, the elastic job's round 0 formed and etcd stopped
// answering for minutes once its beats began; docs/scale.md). So about kPaceSetters of the
// round's nodes (slots spread over it) double the pace when the store took more than a
// quarter of a beat period to answer a beat (or did not answer it), at most once per beat
// period, up to kMaxPace; and halve it after kCalmBeats beats in a row answered within a
// thirty-second of a period, no sooner than two periods after it last changed, down to the
// pace the round started at at most (StartPace: what its formation says the store applies;
// at 5,000 nodes on etcd limited to half a core, pace 4 from round 0's joins, halved to 1
// by calm beats, brought back the beats that stopped etcd, and a raise is a write that etcd
// then no longer answers). Raising is
// safe at once: a watcher that has not read it yet judges its peer by a shorter deadline
// only until its own next beat, a period at most, while the peer beats a period (the new
// one) apart at most: within four of the old. Halving waits until every node beat once at
// the pace before (two periods): a peer then beats at most two new periods apart, within
// the new dead timeout of four. A round starts at the pace its layout names (StartPace; a
// carried round: the start pace of the round it was carried from), and r<R>/pace absent
// means it.
void Rendezvous::FollowPace(const RendezvousInfo& info, const std::optional<std::string>& read,
                            Duration took) {
  constexpr int kPaceSetters = 8;
  constexpr int kCalmBeats = 4;
  const auto now = SteadyClock::now();
  const int64_t round = info.round;
  // Follows r<R>/pace as the store holds it: its text is what a change compares with (even
  // when its number is the pace this node has: a node that missed a change and its return
  // would otherwise compare with a text the store no longer holds, and never set it).
  auto take = [&](const std::string& value) {
    auto pace = ParsePace(value);
    if (!pace) return;
    pace_value_ = value;
    if (*pace == pace_) return;
    pace_ = *pace;
    pace_seen_ = now;
    quiet_period_ = BeatPeriod(info);
  };
  if (read) take(*read);
  const int n = info.group_world_size;
  if ((info.slot - 1) % std::max(1, n / kPaceSetters) != 0) return;
  const Duration period = BeatPeriod(info);
  int64_t to = pace_;
  if (took > period / 4) {
    calm_beats_ = 0;
    if (pace_ < kMaxPace && now - pace_seen_ >= period) to = 2 * pace_;
  } else if (took < period / 32) {
    if (++calm_beats_ >= kCalmBeats && pace_ > info.pace && now - pace_seen_ >= 2 * period) {
      to = std::max(pace_ / 2, info.pace);
    }
  } else {
    calm_beats_ = 0;
  }
  if (to == pace_) return;
  calm_beats_ = 0;
  const std::string value = PaceText(to, info.slot);
  auto set = store_->CompareSet(RoundKey(round, "pace"), pace_value_, value,
                                Deadline::After(period / 2));
  if (!set.ok()) return;  // a store that slow: the next beat tries again
  const int64_t before = pace_;
  take(*set);
  if (*set != value) return;  // another setter changed it first (even to `to`): followed
  log::Get(kLog)->log(to > before ? spdlog::level::warn : spdlog::level::info,
                      "round {}: the store answered a beat in {}; its {} nodes now beat every "
                      "{:.1f} s (pace {}), a silent node found after {:.0f} s", round,
                      took == Duration::max() ? std::string("no time (timed out)")
                                              : fmt::format("{:.2f} s", Seconds(took)),
                      n, Seconds(BeatPeriod(info)), to, Seconds(DeadTimeout(info)));
}

Duration Rendezvous::LivenessPeriod() const {
  return std::max(config_.heartbeat_interval, config_.dead_timeout / 3);
}

// With a will, beats only catch hung agents, and the store dates them (BEAT's ages): one
// per liveness period. Without one (etcd, file store), beats are the only liveness and a
// watcher dates a peer's beat when it sees it, up to a period late (etcd dates it by its
// revisions between two of the watcher's answers: off by at most a period, either way), so
// a live peer's beats may look two periods apart, three when both calls take their whole
// period: a quarter of the dead timeout keeps that under it. A dead node is reported up to
// a period after its deadline (etcd: near it). (Not every heartbeat interval: at 5,000
// nodes on etcd that was 5,000 raft writes and watch streams a second, which three members
// on two cores could not carry; docs/scale.md.) On a lease, the store dates the beats (its
// TTL runs from the last renewal): a third of it leaves two renewals' slack.
Duration Rendezvous::BeatPeriod(const RendezvousInfo& info) const {
  if (will_left_) return LivenessPeriod();
  return std::max(config_.heartbeat_interval, DeadTimeout(info) / (leased_ ? 3 : 4));
}

// Sets up the watch of a new round (the successor); false once nobody is left to watch.
bool Rendezvous::StartWatching(const RendezvousInfo& info) {
  if (watched_round_ != info.round) {
    watched_round_ = info.round;
    watched_slot_ = info.slot % info.group_world_size + 1;
    watched_beat_.clear();
    watched_change_ = SteadyClock::now();
  }
  return watched_slot_ > 0;
}

// Judges the watched peer's counter as read at `seen`: the peer's slot when its will was
// set (`gone`) or its counter has not moved for the dead timeout, else 0. When the store
// says how long ago the counter last moved (`age_ms` >= 0) that dates it; else the change
// is dated when this watcher saw it. A finished peer (its connection ends too) hands the
// watch to the next one still running.
Result<int> Rendezvous::JudgeWatchedPeer(const RendezvousInfo& info,
                                         const std::optional<std::string>& beat, int64_t age_ms,
                                         bool gone, SteadyClock::time_point seen) {
  const int n = info.group_world_size;
  auto after = [n](int slot) { return slot % n + 1; };
  if (beat == "finished") {
    // Move on to the next peer still running: read the following slots in one call.
    std::vector<int> slots;
    std::vector<std::string> keys;
    for (int s = after(watched_slot_);
         s != info.slot && static_cast<int>(slots.size()) < kWatchWindow; s = after(s)) {
      slots.push_back(s);
      keys.push_back(RoundKey(info.round, fmt::format("hb{}", s)));
    }
    watched_slot_ = 0;
    watched_change_ = seen;
    watched_beat_.clear();
    if (keys.empty()) return 0;  // every other node finished
    COHORT_ASSIGN_OR_RETURN(auto beats, store_->Peek(keys, CallDeadline()));
    size_t i = 0;
    while (i < beats.size() && beats[i] == "finished") ++i;
    // All finished: continue after the window next time (the ring wraps to this node).
    watched_slot_ = i < beats.size() ? slots[i] : slots.back();
    if (i < beats.size()) watched_beat_ = beats[i].value_or("");
    return 0;
  }
  if (gone) return watched_slot_;
  if (leased_) {
    // The peer's key is on its lease. There: alive. Gone after it was there: its lease
    // expired (or was revoked: its process ended). Never there yet: the peer had the
    // lease's TTL from the start of this watch to take it.
    if (beat) {
      watched_beat_ = *beat;
      watched_change_ = seen;
      return 0;
    }
    if (!watched_beat_.empty()) return watched_slot_;
    return seen - watched_change_ > DeadTimeout(info) ? watched_slot_ : 0;
  }
  const std::string value = beat.value_or("");
  if (age_ms >= 0) {
    watched_beat_ = value;
    watched_change_ = seen - std::chrono::milliseconds(age_ms);
  } else if (value != watched_beat_) {
    watched_beat_ = value;
    watched_change_ = seen;
    return 0;
  }
  return seen - watched_change_ > DeadTimeout(info) ? watched_slot_ : 0;
}

std::string Rendezvous::PeerHost(const RendezvousInfo& info, int slot) {
  auto node = NodeOf(info, slot);
  if (!node.ok()) return "unknown host";
  // Several nodes may share a host name (containers, network namespaces): the address too.
  return node->addr.empty() || node->addr == node->host ? node->host
                                                        : node->host + " at " + node->addr;
}

// The last member of the round to finish closes the job, which wakes a store host that
// stays up for the others (see Agent) and refuses later joins.
Status Rendezvous::MarkFinished(const RendezvousInfo& info) {
  COHORT_RETURN_IF_ERROR(store_->Set(RoundKey(info.round, fmt::format("hb{}", info.slot)),
                                     "finished", CallDeadline()));
  COHORT_ASSIGN_OR_RETURN(int64_t finished,
                          store_->Add(RoundKey(info.round, "finished"), 1, CallDeadline()));
  if (finished >= info.group_world_size) return CloseJob("succeeded");
  return Status::Ok();
}

Result<std::string> Rendezvous::WaitForJobEnd(const RendezvousInfo& info) {
  for (;;) {
    // This node's heartbeat reads "finished"; it only watches the others.
    COHORT_ASSIGN_OR_RETURN(std::optional<RoundEnd> ended, WatchStep(info, /*beat=*/false));
    if (!ended) continue;
    if (ended->kind == RoundEnd::Kind::kJobDone) break;
    // The round ended without this node (a failure elsewhere); the others may form a new
    // round and finish it. Wait for the job's end at most one join timeout.
    Status st = store_->Wait({Key("done")}, Deadline::After(config_.join_timeout));
    if (!st.ok()) return st;
    break;
  }
  return store_->Get(Key("done"), CallDeadline());
}

}  // namespace cohort::rendezvous
