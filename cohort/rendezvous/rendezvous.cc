// Implements the elastic rendezvous protocol (docs/rendezvous.md): joining and closing
// rounds (Next), ending them (EndRound) and the job (CloseJob). The records' wire forms are
// in rendezvous_records.cc, a running round's liveness (WatchStep) in rendezvous_watch.cc.
// Thread-safety: see rendezvous.h; this file keeps no global state.
#include "cohort/rendezvous/rendezvous.h"

#include "cohort/base/backoff.h"
#include "cohort/base/log.h"
#include "cohort/base/strings.h"
#include "cohort/rendezvous/rendezvous_internal.h"

namespace cohort::rendezvous {

Rendezvous::Rendezvous(std::shared_ptr<store::Store> store, RendezvousConfig config,
                       NodeInfo self)
    : store_(std::move(store)), config_(std::move(config)), self_(std::move(self)) {}

std::string Rendezvous::Key(std::string_view suffix) const {
  return fmt::format("rdzv/{}/{}", config_.run_id, suffix);
}

std::string Rendezvous::RoundKey(int64_t round, std::string_view suffix) const {
  return fmt::format("rdzv/{}/r{}/{}", config_.run_id, round, suffix);
}

Deadline Rendezvous::CallDeadline() const { return Deadline::After(kCallTimeout); }

// The counter `round` is absent until round 0 ends (reads take absent as 0), so joining
// writes nothing to it; it moves from R to R+1 by compare-and-set, once.
Status Rendezvous::AdvanceRound(int64_t round, Deadline retry_until) {
  const std::string expected = round == 0 ? "" : std::to_string(round);
  return RequestUntilDeadline(retry_until, [&](Deadline d) {
           return store_->CompareSet(Key("round"), expected, std::to_string(round + 1), d);
         })
      .status();
}

// Waits until round `round` ends, then makes sure the round counter moved past it.
Status Rendezvous::WaitForNextRound(int64_t round, Deadline deadline) {
  COHORT_RETURN_IF_ERROR(store_->Wait({RoundKey(round, "next")}, deadline));
  return AdvanceRound(round, CallDeadline());
}

// Reads the job's state in one store call: whether it is done (and how), the failures so
// far, the current round and, when the round is the one seen last (L) or the one after it,
// whether it is closed. The round counter moves after the round's `next` is written (by
// the node that ended it): a round L whose `next` exists is over, and the current one is
// at least L + 1, whatever the counter says yet (nodes woken by the end of a round join the
// next one without waiting for the counter, or taking its lag for a running round); a
// round L that is closed was reached, so the current one is at least L.
// A read that times out is made again until `retry_until` (a loaded store).
Result<Rendezvous::JobState> Rendezvous::ReadJobState(Deadline retry_until) {
  const std::vector<std::string> keys = {
      Key("done"),      Key("restarts"), Key("round"), RoundKey(last_round_, "closed"),
      RoundKey(last_round_, "next"), RoundKey(last_round_ + 1, "closed")};
  COHORT_ASSIGN_OR_RETURN(auto values, RequestUntilDeadline(retry_until, [&](Deadline d) {
                            return store_->Peek(keys, d);
                          }));
  JobState s;
  s.done = values[0];
  COHORT_ASSIGN_OR_RETURN(s.restarts, ParseRestarts(values[1]));
  COHORT_ASSIGN_OR_RETURN(s.round, ParseCounter(values[2], "round"));
  if (values[3]) s.round = std::max(s.round, last_round_);
  if (values[4]) s.round = std::max(s.round, last_round_ + 1);
  s.closed_known = s.round == last_round_ || s.round == last_round_ + 1;
  if (s.closed_known) s.closed = std::move(values[s.round == last_round_ ? 3 : 5]);
  last_round_ = s.round;
  return s;
}

// Protocol (each step a constant number of store calls):
//  1. Join round R, the round this node expects (the last it saw; 0 at first), unless R is
//     closed or the job is done, and read the restart count at that moment (one
//     Store::Join: the slot S and node<S>'s record on r<R>/slot).
//  2. Refuse when the job is done or the restart budget is spent. Refused at R: read the
//     job's state (one Peek); the job is at a later round: join that one (step 1); R
//     running (closed): this node is late: ask for a re-rendezvous when R has room
//     (N < MAX), wait for R to end, go to 1 with R + 1.
//  3. (Folded into step 1.)
//  4. Every node but slot 1: wait for r<R>/layout, which carries node 1's record (one
//     Store::GetSince from the join's moment; steps 5-7 are slot 1's). S > the layout's N:
//     spare or late (step 8). Should the layout not come within layout_grace (a round that
//     fills slowly, or slot 1 died), this node goes through steps 5-7 itself.
//  5. Wait until MIN nodes have joined (Store::WaitAppended), bounded by the join timeout.
//  6. Unless closed already, give late nodes the last-call window, cut short when MAX
//     nodes joined or the number of nodes the previous round's end expected (r<R>/expect).
//  7. Close: CompareSet(closed, "", min(slots taken, MAX)); the first writer's N holds.
//     Slot 1 then reads the N node records (Store::ReadAppended) and publishes the layout
//     (run-length local world sizes and its own record); a node that took over after the
//     grace gives slot 1 the grace again, then one such node (r<R>/publisher) publishes.
//     Group rank = S - 1.
//  8. S > N: spare or late; ask for a re-rendezvous when N < MAX, wait for the next round.
// A join thus costs every node but slot 1 two requests on etcd (a txn and a watch) and
// three on the embedded store (Peek, APPEND, GET), whatever the node count.
Result<RendezvousInfo> Rendezvous::Next() {
  const Deadline join_deadline = Deadline::After(config_.join_timeout);
  // After holding round R, this is called once R ended: R + 1 is the round to try first.
  int64_t round = std::max(last_round_, next_round_);
  if (config_.standby && next_round_ == 0) {
    COHORT_ASSIGN_OR_RETURN(round, AwaitVacancy());
  }
  if (held_ && round == held_->round + 1) {
    // A large round that lost a node may have been carried: no join then.
    COHORT_ASSIGN_OR_RETURN(auto carried, TakeCarriedRound(round, join_deadline));
    if (carried) return std::move(*carried);
    round = std::max(last_round_, next_round_);  // past the carried rounds that ended
  }
  for (;;) {
    if (join_deadline.expired()) {
      return DeadlineExceeded("rendezvous '{}' timed out: no round to join within the join "
                              "timeout", config_.run_id);
    }
    // Steps 1 and 2: the join (unless the job is done or R closed; a round's `next` exists
    // only once it closed, or with `done`) and the restart count in one call. Its retries (a
    // loaded store: the call timed out) carry the same token: no second slot.
    last_round_ = round;
    store::Store::JoinRequest request{RoundKey(round, "slot"),
                                      RoundKey(round, "node"),
                                      self_.ToJson(),
                                      {Key("done"), RoundKey(round, "closed")},
                                      {Key("restarts")},
                                      RandomHex(16)};
    COHORT_ASSIGN_OR_RETURN(auto joined, RequestUntilDeadline(join_deadline, [&](Deadline d) {
                              return store_->Join(request, d);
                            }));
    JobState state;
    if (joined.ticket == 0) {
      // Refused: where is the job? (A second request, for late nodes only: the join txn
      // stays small, and etcd's gateway decodes every op of it, taken or not.)
      COHORT_ASSIGN_OR_RETURN(state, ReadJobState(join_deadline));
    } else {
      COHORT_ASSIGN_OR_RETURN(state.restarts,
                              ParseRestarts(joined.read.empty() ? std::nullopt : joined.read[0]));
    }
    if (state.done) {
      return FailedPrecondition("job '{}' is already over ({})", config_.run_id, *state.done);
    }
    if (state.restarts > config_.max_restarts) {
      return FailedPrecondition("the job-wide restart budget is spent ({} failures, "
                                "--max-restarts {})",
                                state.restarts, config_.max_restarts);
    }
    if (joined.ticket == 0) {
      // Refused: round R is over (the job is at a later round: join that one) or running
      // (closed: the state read says so, having read R's keys).
      if (state.round != round) {
        round = state.round;
        continue;
      }
      if (!state.closed) continue;  // neither over nor closed now: join again
      const int64_t members = ParseInt64(*state.closed).value_or(0);
      // A large round is carried with this node appended: its nodes do not join again.
      COHORT_ASSIGN_OR_RETURN(auto appended, JoinCarried(round, members, state.restarts));
      if (appended) return std::move(*appended);
      COHORT_RETURN_IF_ERROR(WaitOutRound(round, members, "is running"));
      ++round;
      continue;
    }
    const int64_t slot = joined.ticket;
    joined_time_ = SteadyClock::now();
    std::optional<Published> published;
    if (slot != 1) {
      // Step 4.
      COHORT_ASSIGN_OR_RETURN(published, ReadPublished(round, joined.seen,
                                                       GraceDeadline(join_deadline)));
    }
    int64_t members = 0;
    if (published) {
      members = published->layout.members;
    } else {
      // Steps 5-7.
      COHORT_ASSIGN_OR_RETURN(members, CloseRound(round, join_deadline));
      if (slot <= members) {
        COHORT_ASSIGN_OR_RETURN(published, PublishLayout(round, members, slot, join_deadline));
      }
    }
    // Step 8.
    if (slot > members) {
      COHORT_RETURN_IF_ERROR(WaitOutRound(round, members, "closed"));
      continue;
    }
    // The layout's write is a later moment than the join (a watch from there replays less).
    const int64_t seen = published->seen > 0 ? published->seen : joined.seen;
    RendezvousInfo info = MakeInfo(round, slot, std::move(*published), state.restarts);
    info.joined_at = seen;
    next_round_ = round + 1;
    held_ = info;
    return info;
  }
}

// Steps 5-7: waits for MIN nodes and the last call, then closes the round (or learns how
// another node closed it); returns its member count.
Result<int64_t> Rendezvous::CloseRound(int64_t round, Deadline join_deadline) {
  // The nodes that joined this round may have read the previous round's end before its
  // counter moved (ReadJobState): make sure it did.
  // Every request here may be repeated and is made again when it times out
  // (RequestUntilDeadline): a node that took over from slot 1 after the grace does this while
  // a large round loads the store (etcd at 10,000 nodes), and a timeout must not end it.
  if (round > 0) COHORT_RETURN_IF_ERROR(AdvanceRound(round - 1, join_deadline));
  // Step 5.
  Status enough = UntilDeadline(join_deadline, [&] {
    return store_->WaitAppended(RoundKey(round, "slot"), RoundKey(round, "node"),
                                config_.min_nodes, join_deadline);
  });
  if (!enough.ok()) {
    if (!IsTimeout(enough)) return enough;
    auto joined = store_->CountTickets(RoundKey(round, "slot"), CallDeadline());
    return DeadlineExceeded(
        "rendezvous '{}' timed out: {} of the minimum {} node(s) joined round {} within the "
        "join timeout of {} s",
        config_.run_id, joined.ok() ? *joined : -1, config_.min_nodes, round,
        std::chrono::duration_cast<std::chrono::seconds>(config_.join_timeout).count());
  }
  // Step 6 (nothing to wait for when MIN = MAX: node<MAX> exists already).
  bool full = config_.min_nodes == config_.max_nodes;
  if (!full) {
    COHORT_ASSIGN_OR_RETURN(auto now, RequestUntilDeadline(join_deadline, [&](Deadline d) {
                              return store_->Peek(
                                  {RoundKey(round, "closed"), RoundKey(round, "expect")}, d);
                            }));
    if (!now[0]) {
      // The last call ends early once node<MAX> joined, or as many nodes as the previous
      // round's end expected (its members but a lost one, or plus a joiner).
      int64_t awaited = config_.max_nodes;
      const std::optional<int64_t> expect = now[1] ? ParseInt64(*now[1]) : std::nullopt;
      if (expect && *expect >= config_.min_nodes && *expect < awaited) awaited = *expect;
      Status waited =
          store_->WaitAppended(RoundKey(round, "slot"), RoundKey(round, "node"), awaited,
                               Deadline::After(config_.last_call).Earlier(join_deadline));
      if (!waited.ok() && !IsTimeout(waited)) return waited;
      full = waited.ok() && awaited == config_.max_nodes;
    }
  }
  // When MAX nodes joined, MAX slots are taken: no need to count them.
  int64_t proposal = config_.max_nodes;
  if (!full) {
    COHORT_ASSIGN_OR_RETURN(int64_t taken, RequestUntilDeadline(join_deadline, [&](Deadline d) {
                              return store_->CountTickets(RoundKey(round, "slot"), d);
                            }));
    proposal = std::min<int64_t>(taken, config_.max_nodes);
  }
  COHORT_ASSIGN_OR_RETURN(std::string closed_value,
                          RequestUntilDeadline(join_deadline, [&](Deadline d) {
                            return store_->CompareSet(RoundKey(round, "closed"), "",
                                                      std::to_string(proposal), d);
                          }));
  const int64_t members = ParseInt64(closed_value).value_or(0);
  if (members <= 0) return DataLoss("round {} closed with a bad member count", round);
  return members;
}

// Steps 2 and 7 for a node outside a closed round: ask for a re-rendezvous when the round
// has room (N < MAX), then wait for the round to end.
Status Rendezvous::WaitOutRound(int64_t round, int64_t members, std::string_view how) {
  if (members < config_.max_nodes) {
    COHORT_LOG_INFO(kLog, "round {} {} with room; asking for a re-rendezvous", round, how);
    COHORT_RETURN_IF_ERROR(
        EndRound(round, RoundEnd{RoundEnd::Kind::kJoin, self_.host}, nullptr, members + 1)
            .status());
  } else {
    COHORT_LOG_INFO(kLog, "round {} {} with {} nodes; waiting as a spare", round, how, members);
  }
  return WaitForNextRound(round, Deadline::Infinite());
}

// A warm spare takes a lost node's place: it waits on the running round's end; when the
// round lost a node (kDeadNode), the spare claims one of the places left (r<R+1>/spares,
// at most MAX - (N - 1) claims win), raises the next round's expected count so that its
// last call waits for it, and joins once the survivors have (or the last call is over):
// its slot comes after theirs, so a round that closed on the old count leaves out the
// spare, never a survivor (the spare then asks for a re-rendezvous as a late node does).
// Other ends (a failure, a join) are waited out: the spare waits for the next round to
// close and watches that one.
Result<int64_t> Rendezvous::AwaitVacancy() {
  bool counted = false;
  for (;;) {
    COHORT_ASSIGN_OR_RETURN(JobState state, ReadJobState(Deadline::After(config_.join_timeout)));
    if (state.done) {
      return FailedPrecondition("job '{}' is already over ({})", config_.run_id, *state.done);
    }
    const int64_t round = state.round;
    COHORT_ASSIGN_OR_RETURN(auto now, store_->Peek({RoundKey(round, "closed"),
                                                    RoundKey(round, "next")}, CallDeadline()));
    if (now[1]) {  // over: the next one
      last_round_ = round + 1;
      continue;
    }
    if (!now[0]) {  // forming: wait until it closes (or ends), then look again
      COHORT_LOG_INFO(kLog, "round {} is forming; a warm spare waits until it runs", round);
      COHORT_RETURN_IF_ERROR(store_->Wait({RoundKey(round, "closed")}, Deadline::Infinite()));
      last_round_ = round;
      continue;
    }
    const int64_t members = ParseInt64(*now[0]).value_or(0);
    COHORT_LOG_INFO(kLog, "round {} runs with {} node(s); waiting as a warm spare for a lost "
                    "node", round, members);
    if (!counted) {  // `standby`: the warm spares that ever waited (after this, any end counts)
      COHORT_RETURN_IF_ERROR(store_->Add(Key("standby"), 1, CallDeadline()).status());
      counted = true;
    }
    COHORT_ASSIGN_OR_RETURN(std::string next,
                            store_->Get(RoundKey(round, "next"), Deadline::Infinite()));
    const RoundEnd end = RoundEnd::Decode(next);
    last_round_ = round + 1;
    if (end.kind == RoundEnd::Kind::kJobDone) {
      return FailedPrecondition("job '{}' is over", config_.run_id);
    }
    if (end.kind != RoundEnd::Kind::kDeadNode) continue;
    const int64_t survivors = members - 1;
    COHORT_ASSIGN_OR_RETURN(int64_t claim,
                            store_->Add(RoundKey(round + 1, "spares"), 1, CallDeadline()));
    if (claim > config_.max_nodes - survivors) continue;  // other spares took the places
    COHORT_RETURN_IF_ERROR(store_->Add(RoundKey(round + 1, "expect"), 1, CallDeadline()).status());
    COHORT_LOG_INFO(kLog, "round {} lost a node ({}); a warm spare joins round {}", round,
                    end.detail, round + 1);
    if (survivors > 0) {
      Status behind = store_->WaitAppended(RoundKey(round + 1, "slot"),
                                           RoundKey(round + 1, "node"), survivors,
                                           Deadline::After(config_.last_call));
      if (!behind.ok() && !IsTimeout(behind)) return behind;
    }
    return round + 1;
  }
}


// Step 4: the layout with node 1's record, once slot 1 published it; nullopt when it did
// not come by `deadline`. `seen`: a Join's mark of a moment the layout was absent (0: none).
Result<std::optional<Rendezvous::Published>> Rendezvous::ReadPublished(int64_t round,
                                                                       int64_t seen,
                                                                       Deadline deadline) {
  auto read = UntilDeadline(deadline, [&] {
    return store_->GetSince(RoundKey(round, "layout"), &seen, deadline);
  });
  if (!read.ok()) {
    if (IsTimeout(read.status())) return std::optional<Published>();
    return read.status();
  }
  COHORT_ASSIGN_OR_RETURN(Published published, Published::Decode(*read));
  published.seen = seen;
  return std::optional<Published>(std::move(published));
}

// Step 7's end, for a round closed with `members` nodes: slot 1 reads the N node records
// once and publishes the layout (first writer wins). Any other node here took over after
// the grace: it gives slot 1 the grace once more, now that the round is closed; then one
// node, the first to claim r<R>/publisher, publishes in its place and the others give it a
// grace too (every node past the grace reading the N records would cost N^2). A claimant
// that has not published by then is replaced the same way, one node per grace: the first
// to move the claim from it to itself (a compare-and-set from the claimant read). (Past
// the claimant's grace every node published until 2026-12-07: at 10,000 nodes on an etcd
// slowed until it lost its leader, thousands of nodes each read the 10,000 records.)
Result<Rendezvous::Published> Rendezvous::PublishLayout(int64_t round, int64_t members,
                                                        int64_t slot, Deadline join_deadline) {
  std::optional<Published> published;
  std::string claimant;  // r<R>/publisher as last read ("": none); slot 1 publishes anyway
  if (slot != 1) {
    COHORT_ASSIGN_OR_RETURN(published, ReadPublished(round, 0, GraceDeadline(join_deadline)));
    const std::string me = std::to_string(slot);
    while (!published) {
      COHORT_ASSIGN_OR_RETURN(std::string now, RequestUntilDeadline(join_deadline, [&](Deadline d) {
                                return store_->CompareSet(RoundKey(round, "publisher"),
                                                          claimant, me, d);
                              }));
      if (now == me) break;
      // The claimant gets one grace; should it not publish either, the claim moves on.
      claimant = std::move(now);
      COHORT_ASSIGN_OR_RETURN(published, ReadPublished(round, 0, GraceDeadline(join_deadline)));
    }
  }
  if (!published) {
    if (slot != 1) {
      COHORT_LOG_WARN(kLog, "round {}: slot 1 did not publish the layout{}; publishing it",
                      round, claimant.empty() ? std::string()
                                              : fmt::format(" (nor slot {}, which took it over)",
                                                            claimant));
    }
    // Bounded by the join's deadline, not one call's: N records are N/1,000 range requests
    // on etcd, and under a 10,000-node join's load they took slot 1 over 30 s (it failed).
    COHORT_ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, ReadNodes(round, members, join_deadline));
    Published ours;
    ours.layout = RoundLayout::FromNodes(nodes);
    ours.master = std::move(nodes[0]);
    ours.tell_key = RandomHex(16);
    ours.pace = StartPace(round, members);
    COHORT_ASSIGN_OR_RETURN(std::string text, RequestUntilDeadline(join_deadline, [&](Deadline d) {
                              return store_->CompareSet(RoundKey(round, "layout"), "",
                                                        ours.Encode(), d);
                            }));
    COHORT_ASSIGN_OR_RETURN(published, Published::Decode(text));
  }
  if (published->layout.members != members) {
    return DataLoss("round {} layout has {} members, the round closed with {}", round,
                    published->layout.members, members);
  }
  return std::move(*published);
}

// A quiet round's beats start at the pace its formation says the store can take: its N
// joins came in T s, and its beats at pace 1 would be N per beat period (QuietDeadTimeout /
// 4); the pace is the least power of two, at most 4, that brings the beats within twice the
// joins' rate N / T (a join is two requests: about what the store applied meanwhile). At
// 5,000 nodes on etcd limited to half a core, the joins came at 45-94 a second and the beats
// at 500 a second stopped etcd within seconds of round 0 closing, before any node could
// raise the pace (FollowPace: the raise is a write, which etcd no longer answered); at
// 10,000 nodes on etcd on two shared cores, 330-550 joins a second (pace 1), and 5,000 on
// one core 390 (pace 1). A round whose nodes came slowly (T counts from slot 1's join) beats
// slower than it need for as long as it and the rounds carried from it run (its pace
// setters lower the pace to this one at most). Logged at info: slot 1 does not know whether
// the round will be quiet (a store with wills is not; its watchers log the period they beat
// at when it is).
int64_t Rendezvous::StartPace(int64_t round, int64_t members) const {
  constexpr int64_t kMaxStartPace = 4;
  if (members < config_.quiet_start_nodes || config_.quiet_beats_per_s <= 0) return 1;
  const double formed_s = std::chrono::duration<double>(SteadyClock::now() - joined_time_).count();
  if (formed_s <= 0) return 1;
  const double joins_per_s = static_cast<double>(members) / formed_s;
  const double period_s =
      std::chrono::duration<double>(CounterBeatPeriod(config_, static_cast<int>(members))).count();
  const double beats_per_s = static_cast<double>(members) / period_s;
  int64_t pace = 1;
  while (pace < kMaxStartPace && beats_per_s / static_cast<double>(pace) > 2 * joins_per_s) {
    pace *= 2;
  }
  if (pace > 1) {
    COHORT_LOG_INFO(kLog, "round {}: its {} nodes joined in {:.1f} s ({:.0f} a second); they "
                    "beat {} times less often than {:.0f} a second until the store answers "
                    "their beats quickly (pace {})", round, members, formed_s, joins_per_s,
                    pace, beats_per_s, pace);
  }
  return pace;
}

Result<std::vector<NodeInfo>> Rendezvous::RoundNodes(const RendezvousInfo& info,
                                                     Deadline deadline) {
  const CarriedMembers& carried = info.carried;
  if (carried.records_round < 0) return ReadNodes(info.round, info.group_world_size, deadline);
  // A carried round: its records round's nodes but those left out, then those appended.
  const int recorded = info.RecordedMembers();
  std::vector<NodeInfo> nodes;
  nodes.reserve(info.group_world_size);
  if (recorded > 0) {
    COHORT_ASSIGN_OR_RETURN(
        std::vector<NodeInfo> all,
        ReadNodes(carried.records_round, recorded + static_cast<int64_t>(carried.left_out.size()),
                  deadline));
    for (int slot = 1; slot <= recorded; ++slot) {
      nodes.push_back(std::move(all[info.RecordSlot(slot) - 1]));
    }
  }
  for (const auto& a : carried.appended) nodes.push_back(a.node);
  return nodes;
}

Result<NodeInfo> Rendezvous::NodeOf(const RendezvousInfo& info, int slot) {
  if (slot > info.RecordedMembers()) {  // appended to a carried round: its record is there
    const size_t i = slot - info.RecordedMembers() - 1;
    if (i >= info.carried.appended.size()) return NotFound("round {} has no node {}", info.round, slot);
    return info.carried.appended[i].node;
  }
  const int64_t round = info.RecordsRound();
  COHORT_ASSIGN_OR_RETURN(auto record,
                          store_->ReadAppended(RoundKey(round, "slot"), RoundKey(round, "node"),
                                               info.RecordSlot(slot), 1, CallDeadline()));
  if (record.empty()) return DataLoss("round {} has no record of its slot {}", round, slot);
  return NodeInfo::FromJson(record[0]);
}

Result<std::vector<NodeInfo>> Rendezvous::ReadNodes(int64_t round, int64_t members,
                                                    Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> records, UntilDeadline(deadline, [&] {
                            return store_->ReadAppended(RoundKey(round, "slot"),
                                                        RoundKey(round, "node"), 1, members,
                                                        deadline);
                          }));
  std::vector<NodeInfo> nodes;
  nodes.reserve(records.size());
  for (const auto& r : records) {
    COHORT_ASSIGN_OR_RETURN(NodeInfo node, NodeInfo::FromJson(r));
    nodes.push_back(std::move(node));
  }
  return nodes;
}

RendezvousInfo Rendezvous::MakeInfo(int64_t round, int64_t slot, Published published,
                                    int64_t restarts) const {
  RendezvousInfo info;
  info.round = round;
  info.slot = static_cast<int>(slot);
  info.group_rank = static_cast<int>(slot - 1);
  info.group_world_size = published.layout.members;
  info.master = std::move(published.master);
  info.rank_offset = published.layout.RankOffset(info.group_rank);
  info.world_size = published.layout.WorldSize();
  info.layout = std::move(published.layout);
  info.carried = std::move(published.carried);
  info.tell_key = std::move(published.tell_key);
  info.pace = published.pace;
  info.restart_count = restarts;
  info.store_prefix = fmt::format("rdzv/{}/r{}/w", config_.run_id, round);
  COHORT_LOG_DEBUG(kLog, "round {}: node {} of {}", round, info.group_rank,
                   info.group_world_size);
  return info;
}


// Protocol: claim the end of the round (first claimant wins), count a failure once in
// `restarts`, publish the failure record, then `next` (which wakes every watcher) and
// finally advance the round counter.
Result<bool> Rendezvous::EndRound(int64_t round, const RoundEnd& why,
                                  const FailureRecord* failure, int64_t expect_next) {
  COHORT_ASSIGN_OR_RETURN(Ended ended, EndRoundThen(round, why, failure, expect_next, nullptr, {}));
  return ended.won;
}

Result<bool> Rendezvous::EndRound(const RendezvousInfo& info, const RoundEnd& why,
                                  const FailureRecord* failure, int64_t expect_next) {
  COHORT_ASSIGN_OR_RETURN(Ended ended, EndRoundThen(info.round, why, failure, expect_next,
                                                    nullptr, {&info, info.group_rank}));
  return ended.won;
}

Result<Rendezvous::Ended> Rendezvous::EndRoundThen(int64_t round, const RoundEnd& why,
                                      const FailureRecord* failure, int64_t expect_next,
                                      const BeforeNext& before_next, TellTo tell) {
  const std::string reason = why.Encode();
  std::string claim = fmt::format("{}#{}", reason, RandomHex(8));
  // Every request here may be repeated (compare-and-sets from absent, with a claim of this
  // call's own; a Set of the same value; the restart count's compare-and-set, CountRestart):
  // one that a loaded store timed out is sent again until the layout grace, as a join's are,
  // so that an overloaded etcd does not end with an error the node that found the round's
  // end (it holds the claim: no other node would write `next`, and the round could not end).
  Deadline until = Deadline::After(config_.layout_grace);
  auto put_once = [&](const std::string& key, const std::string& value) {
    return RequestUntilDeadline(until,
                                [&](Deadline d) { return store_->CompareSet(key, "", value, d); });
  };
  auto start = SteadyClock::now();
  COHORT_ASSIGN_OR_RETURN(std::string owner, put_once(RoundKey(round, "ended_by"), claim));
  const std::string failure_key = RoundKey(round, "failure");
  if (owner != claim) {
    if (failure != nullptr) {
      COHORT_RETURN_IF_ERROR(put_once(failure_key, failure->ToJson()).status());
    }
    // The winner sets `next`; it exists before this returns, so callers can rely on it.
    COHORT_ASSIGN_OR_RETURN(bool took_over, AwaitEndOrTakeOver(round, owner, claim, tell.info));
    if (!took_over) {
      COHORT_RETURN_IF_ERROR(AdvanceRound(round, CallDeadline()));
      return Ended{};
    }
    until = Deadline::After(config_.layout_grace);  // this node's requests as the winner's
    start = SteadyClock::now();
  }
  // The winner's requests before `next` that do not depend on one another go at once, each
  // on a thread of its own but the carry (they read only store_ and config_): on a loaded
  // etcd each takes a few hundred ms, and at 10,000 nodes this chain, one after another,
  // was 3.3-3.7 s of a loss's 5.8 s (docs/scale.md). It reads the records of the nodes it
  // tells meanwhile too. Each is waited for before `next` (the futures' destructors wait
  // on every early return).
  auto nodes = tell.info ? ReadForTell(*tell.info) : std::future<Nodes>();
  auto at_once = [](auto request) { return std::async(std::launch::async, std::move(request)); };
  std::future<Status> failure_put, expect_put;
  std::future<Result<int64_t>> count;
  if (failure != nullptr) {
    failure_put = at_once([&, record = failure->ToJson()] {
      return put_once(failure_key, record).status();
    });
  }
  if (why.CountsAsFailure()) count = at_once([&] { return CountRestart(round, until); });
  if (expect_next > 0) {  // before `next`: every node that joins the next round sees it
    expect_put = at_once([&] {
      return RequestUntilDeadline(until, [&](Deadline d) {
        return store_->Set(RoundKey(round + 1, "expect"), std::to_string(expect_next), d);
      });
    });
  }
  const double claim_s = SecondsSince(start);
  std::optional<Carry> carry = before_next ? before_next() : std::nullopt;
  const double carry_s = SecondsSince(start) - claim_s;
  if (failure_put.valid()) COHORT_RETURN_IF_ERROR(failure_put.get());
  if (expect_put.valid()) COHORT_RETURN_IF_ERROR(expect_put.get());
  if (count.valid()) {
    COHORT_ASSIGN_OR_RETURN(int64_t restarts, count.get());
    if (carry) carry->restarts = restarts;  // the count after this end
  }
  const double requests_s = SecondsSince(start) - claim_s;
  RoundEnd told = why;  // what `next` says: the reason, and the round carried into
  Ended ended{true, false};
  if (carry) {
    told.carried = RoundEnd::Carried{carry->restarts, carry->layout};
    auto published = RequestUntilDeadline(until, [&](Deadline d) {
      return store_->CreateAll(
          {RoundKey(round + 1, "closed"), RoundKey(round + 1, "layout"), RoundKey(round, "next")},
          {std::to_string(carry->members), carry->layout, told.Encode()}, d);
    });
    ended.carried = published.ok() && *published;
    if (!ended.carried) {
      COHORT_LOG_WARN(kLog, "round {}: could not carry its nodes into round {} ({}); they join "
                      "it", round, round + 1,
                      published.ok() ? "it was closed already" : published.status().ToString());
      told.carried.reset();
    }
  }
  std::string end = told.Encode();
  if (!ended.carried) {
    COHORT_ASSIGN_OR_RETURN(end, put_once(RoundKey(round, "next"), end));
  }
  LogEndWritten(round, {claim_s, carry_s, requests_s, SecondsSince(start) - claim_s - requests_s});
  if (nodes.valid()) TellEnd(*tell.info, end, tell.skip, std::move(nodes));
  COHORT_RETURN_IF_ERROR(AdvanceRound(round, CallDeadline()));
  return ended;
}

// How long the winner took to write `next` after it found the end (LevelOfEndTaking).
void Rendezvous::LogEndWritten(int64_t round, const EndTimes& t) {
  const double total = t.claim_s + t.requests_s + t.write_s;
  log::Get(kLog)->log(LevelOfEndTaking(total),
                      "round {}: its end written in {:.2f} s (the claim {:.2f} s, the requests "
                      "and reads at once {:.2f} s of which the carry's {:.2f} s, `next` {:.2f} "
                      "s)", round, total, t.claim_s, t.requests_s, t.carry_s, t.write_s);
}

// The restart count goes up by one with a compare-and-set from the value read, not an Add,
// and names the round whose end counted it ("N@R", RestartCount): a compare-and-set whose
// answer a loaded store lost can be sent again (the count is then found already counted
// for this round, the write this call made), where an Add sent again would count the
// failure twice; and a node that took over the end of a winner that died after counting
// finds the count made (EndRoundThen). Only the running round's winners change the count,
// and rounds end one after another.
Result<int64_t> Rendezvous::CountRestart(int64_t round, Deadline until) {
  const std::string key = Key("restarts");
  COHORT_ASSIGN_OR_RETURN(auto now, RequestUntilDeadline(until, [&](Deadline d) {
                            return store_->Peek({key}, d);
                          }));
  std::optional<std::string> from = std::move(now[0]);
  for (;;) {
    COHORT_ASSIGN_OR_RETURN(RestartCount count, RestartCount::Parse(from));
    if (count.round == round) return count.count;  // this round's end counted it already
    const std::string to = RestartCount{count.count + 1, round}.Encode();
    COHORT_ASSIGN_OR_RETURN(std::string after, RequestUntilDeadline(until, [&](Deadline d) {
                              return store_->CompareSet(key, from.value_or(""), to, d);
                            }));
    if (after == to) return count.count + 1;
    if (until.expired()) {
      return DeadlineExceeded("the restart count kept changing under this end ({} -> {})",
                              from.value_or(""), after);
    }
    from = std::move(after);  // the count as the store answered: go on from there
  }
}

// A loser waits for the winner's `next` up to the layout grace: the winner's requests are
// sent again only until the layout grace from its claim, which came before this node lost
// it. No `next` by then: the winner died, or lost the store, after its claim, and the
// round would never end (every node's wait for `next` failing, watchers blocked in it
// taken for dead by theirs). The first loser to replace the stale claim with its own
// (a compare-and-set from it) ends the round in the winner's place; the others wait for
// it as for any winner. A winner that was only slow and writes after all is harmless:
// `next` and a carried round are created once (what the store holds is what every node
// reads), and the restart count is counted once per round (CountRestart).
// A loser that watches `held`'s round (its watcher found the round's end) beats while it
// waits, once a beat period: else its own watcher took it for dead after the dead timeout,
// and the node that took the end over found it silent and left it out of the carried
// round (it joined the next as a late node).
// Returns whether this node took the end over; waits at most the join timeout in all.
Result<bool> Rendezvous::AwaitEndOrTakeOver(int64_t round, std::string owner,
                                           const std::string& claim,
                                           const RendezvousInfo* held) {
  const std::string next = RoundKey(round, "next");
  const Deadline give_up = Deadline::After(config_.join_timeout);
  const bool beats = held != nullptr && held->round == round && first_step_round_ == round &&
                     held->group_world_size > 1;
  Deadline grace = Deadline::After(config_.layout_grace).Earlier(give_up);
  for (;;) {
    Status waited;
    if (beats) {  // one beat a period, each waiting for `next` until the next one is due
      auto beat = store_->Beat(RoundKey(round, fmt::format("hb{}", held->slot)), {}, {next},
                               grace.Earlier(Deadline::After(BeatPeriod(*held))));
      if (beat.ok() && beat->waited) return false;
      waited = beat.ok() ? DeadlineExceeded("no `next` for round {} yet", round)
                         : beat.status();
    } else {
      waited = store_->Wait({next}, grace);
      if (waited.ok()) return false;
    }
    if (!IsTimeout(waited)) return waited;
    if (!grace.expired()) continue;  // the next beat
    if (give_up.expired()) return waited;
    COHORT_ASSIGN_OR_RETURN(std::string now, RequestUntilDeadline(CallDeadline(), [&](Deadline d) {
                              return store_->CompareSet(RoundKey(round, "ended_by"), owner,
                                                        claim, d);
                            }));
    if (now == claim) {
      COHORT_LOG_WARN(kLog, "round {}: the node that claimed its end ({}) wrote no `next` "
                      "within the layout grace of {:.0f} s; this node ends the round in its "
                      "place", round, owner,
                      std::chrono::duration<double>(config_.layout_grace).count());
      return true;
    }
    owner = std::move(now);  // another loser took it over first: wait for that one
    grace = Deadline::After(config_.layout_grace).Earlier(give_up);
  }
}

Result<FailureRecord> Rendezvous::GetFailure(int64_t round) {
  COHORT_ASSIGN_OR_RETURN(bool present, store_->Check({RoundKey(round, "failure")},
                                                      CallDeadline()));
  if (!present) return NotFound("round {} has no failure record", round);
  COHORT_ASSIGN_OR_RETURN(std::string text, store_->Get(RoundKey(round, "failure"),
                                                        CallDeadline()));
  return FailureRecord::FromJson(text);
}


Deadline Rendezvous::GraceDeadline(Deadline join_deadline) const {
  return join_deadline.Earlier(Deadline::After(config_.layout_grace + quiet_period_));
}


Status Rendezvous::CloseJob(std::string_view outcome) {
  COHORT_RETURN_IF_ERROR(
      store_->CompareSet(Key("done"), "", std::string(outcome), CallDeadline()).status());
  // Wake spares and late joiners parked on the current round's `next`.
  COHORT_ASSIGN_OR_RETURN(JobState state, ReadJobState(CallDeadline()));
  return store_->CompareSet(RoundKey(state.round, "next"), "",
                            RoundEnd{RoundEnd::Kind::kJobDone, ""}.Encode(), CallDeadline())
      .status();
}

}  // namespace cohort::rendezvous
