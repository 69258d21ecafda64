// Carried rounds (RendezvousConfig::carry_start_nodes; docs/rendezvous.md): a large round
// that loses a node is followed by a round of its survivors that nobody joins. The node
// that ends the round for the lost node closes the next one and publishes its layout
// (CarryRound; written with the end's `next` in one request); each survivor then takes it
// with one read (TakeCarriedRound, from Next) and keeps its order. A node that arrives at a
// large running round carries it the same way with itself appended (JoinCarried). Joining
// was the cost: at 10,000 nodes on etcd every node's join txn and layout watch at once
// after each loss, which took longer than the round before it and made etcd lose its
// leader (docs/scale.md).
// Thread-safety: see rendezvous.h; this file keeps no global state.
#include <algorithm>
#include <future>
#include <optional>

#include "cohort/base/log.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/rendezvous/rendezvous_internal.h"

namespace cohort::rendezvous {

// Who is lost with `dead_slot`, from the store in one read, so that nodes lost together are
// left out of one carried round, not found one dead timeout apart (each a round of its
// own): every node whose beat key the store shows silent for `quiet_for` (Store::Silent:
// two beat periods, as a live node beats every period; the store's own dating, so no
// watcher's lateness counts; a missing key, never beaten or its lease ended, is silent; a
// key on its lease is not). Not in a young round (its layout written less than `quiet_for`
// ago: its nodes may not have beaten yet): there only the dead node. `beats` are the
// round's hb<S> keys and `layout` its r<R>/layout. Group ranks, ascending; nullopt when
// the store cannot date writes (the embedded store, which re-forms 10,000 nodes by joins in
// about a second anyway).
static std::optional<std::vector<int>> LostWith(store::Store& store,
                                                const std::vector<std::string>& beats,
                                                const std::string& layout, int self_slot,
                                                int dead_slot, Duration quiet_for,
                                                int64_t round) {
  std::vector<std::string> keys = beats;
  keys.push_back(layout);
  auto silent = store.Silent(keys, quiet_for, Deadline::After(kCallTimeout));
  if (!silent.ok()) {
    COHORT_LOG_INFO(kLog, "round {}: the store does not say which other nodes are silent ({}); "
                    "not carrying", round, silent.status().ToString());
    return std::nullopt;
  }
  std::vector<int> lost = {dead_slot - 1};
  if (silent->back()) {  // the round is older than quiet_for
    for (int slot = 1; slot <= static_cast<int>(beats.size()); ++slot) {
      if (slot != self_slot && slot != dead_slot && (*silent)[slot - 1]) lost.push_back(slot - 1);
    }
  }
  std::sort(lost.begin(), lost.end());
  return lost;
}


Result<bool> Rendezvous::EndRoundForLostNode(const RendezvousInfo& info, int lost_slot,
                                             const RoundEnd& why, const FailureRecord& record) {
  // A large round is carried: the survivors need not join the next.
  int64_t survivors = 0;
  auto carry = [&]() -> std::optional<Carry> {
    auto carried = CarryRound(info, lost_slot);
    if (!carried.ok()) {
      COHORT_LOG_WARN(kLog, "round {}: could not carry the survivors into round {} ({}); they "
                      "join it", info.round, info.round + 1, carried.status().ToString());
      return std::nullopt;
    }
    if (*carried) survivors = (*carried)->members;
    return std::move(*carried);  // (its restart count is set by EndRoundThen: a loss counts one)
  };
  COHORT_ASSIGN_OR_RETURN(Ended ended,
                          EndRoundThen(info.round, why, &record, info.group_world_size - 1, carry,
                                       {&info, info.group_rank}));
  if (ended.carried) {
    COHORT_LOG_WARN(kLog, "round {}: carried its {} surviving node(s) into round {} ({} left "
                    "out)", info.round, survivors, info.round + 1,
                    info.group_world_size - survivors);
  }
  return ended.won;
}

// The members of `info`'s round without the group ranks `lost` (ascending), as the next
// carried round's: recorded nodes lost are left out, appended ones dropped.
static CarriedMembers MembersWithout(const RendezvousInfo& info, const std::vector<int>& lost) {
  CarriedMembers next;
  next.records_round = info.RecordsRound();
  next.left_out = info.carried.left_out;
  const int recorded = info.RecordedMembers();
  for (size_t i = 0; i < info.carried.appended.size(); ++i) {
    if (!std::binary_search(lost.begin(), lost.end(), recorded + static_cast<int>(i))) {
      next.appended.push_back(info.carried.appended[i]);
    }
  }
  for (int g : lost) {
    if (g < recorded) next.left_out.push_back(info.RecordSlot(g + 1));
  }
  std::sort(next.left_out.begin(), next.left_out.end());
  return next;
}

// The slot of `held`'s node in the carried round of `members` nodes that `carried`
// describes (nullopt: not in it). Its recorded nodes come first, then the appended ones.
static std::optional<int64_t> SlotIn(const CarriedMembers& carried, int members,
                                     const RendezvousInfo& held) {
  if (carried.records_round != held.RecordsRound()) return std::nullopt;
  const auto& out = carried.left_out;
  if (held.slot > held.RecordedMembers()) {  // appended: found by its token
    const auto& token = held.carried.appended[held.slot - held.RecordedMembers() - 1].token;
    const int64_t recorded = members - static_cast<int64_t>(carried.appended.size());
    for (size_t i = 0; i < carried.appended.size(); ++i) {
      if (carried.appended[i].token == token) return recorded + static_cast<int64_t>(i) + 1;
    }
    return std::nullopt;
  }
  const int record = held.RecordSlot(held.slot);
  if (std::binary_search(out.begin(), out.end(), record)) return std::nullopt;
  return record - (std::lower_bound(out.begin(), out.end(), record) - out.begin());
}

Result<int> Rendezvous::GroupRankAt(const RendezvousInfo& info, std::string_view addr,
                                    Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(std::vector<NodeInfo> nodes, RoundNodes(info, deadline));
  int found = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].addr != addr) continue;
    if (found >= 0) return -1;  // two nodes on one address: it names neither
    found = static_cast<int>(i);
  }
  return found;
}

// The pace `info`'s round beats at: its watcher's (FollowPace: read with each beat) when this
// node watches the round, else the store's r<R>/pace, never below the start pace. (An
// agent's own Rendezvous ends rounds for its worker's lost peer and watches none: with the
// start pace alone, a node beating at a pace raised since looked silent and was left out
// of the carried round, to join it again as a late node.) Unread: the start pace.
int64_t Rendezvous::PaceNow(const RendezvousInfo& info) {
  if (first_step_round_ == info.round) return pace_;
  auto read = store_->Peek({RoundKey(info.round, "pace")}, CallDeadline());
  if (!read.ok() || !(*read)[0]) return info.pace;
  return std::max(info.pace, ParsePace(*(*read)[0]).value_or(info.pace));
}

Result<bool> Rendezvous::MayCarry(int64_t round) {
  COHORT_ASSIGN_OR_RETURN(auto state, store_->Peek({RoundKey(round, "finished"), Key("standby"),
                                                    Key("done")},
                                                   CallDeadline()));
  return !state[0] && !state[1] && !state[2];
}

bool Rendezvous::Carries(int64_t members) const {
  return config_.carry_start_nodes > 0 && members >= config_.carry_start_nodes;
}

// Protocol (the winner of the round's end, while its other requests of the end are in
// flight; EndRoundThen publishes what this returns):
//  1. Carry only a round of at least carry_start_nodes that MayCarry (no node finished:
//     r<R>/finished; no warm spare waits: `standby`, as a spare takes a lost node's place in
//     a joined round; the job not over), with at least MIN survivors, and at most half the
//     nodes lost (more is a store or network fault, not lost nodes: join as usual). The
//     two reads (MayCarry's, and LostWith's below) go at once.
//  2. Lost: the dead peer and every node silent with it (LostWith); not carried on a store
//     that cannot tell which.
//  3. The next round: R's layout without the lost ranks, the new group rank 0's record
//     (read from the records round when node 0 was lost), the records round with the slots
//     of it left out, and the appended nodes still there. EndRoundThen writes its member
//     count in r<R+1>/closed (nobody can join R+1: a node that arrives finds it running and
//     asks for a re-rendezvous, as a late node), its layout and `next` in one request.
Result<std::optional<Rendezvous::Carry>> Rendezvous::CarryRound(const RendezvousInfo& info,
                                                               int dead_slot) {
  using Carried = std::optional<Carry>;
  const int n = info.group_world_size;
  const int64_t round = info.round;
  if (!Carries(n)) return Carried();
  auto may = std::async(std::launch::async, [this, round] { return MayCarry(round); });
  std::vector<std::string> beats;
  beats.reserve(n);
  for (int slot = 1; slot <= n; ++slot) beats.push_back(RoundKey(round, fmt::format("hb{}", slot)));
  // Silent: two beat periods at the round's pace (a live node beats once a period).
  auto found = LostWith(*store_, beats, RoundKey(round, "layout"), info.slot, dead_slot,
                        2 * CounterBeatPeriod(config_, n) * PaceNow(info), round);
  COHORT_ASSIGN_OR_RETURN(bool may_carry, may.get());
  if (!found || !may_carry) return Carried();
  const std::vector<int>& lost = *found;
  const int survivors = n - static_cast<int>(lost.size());
  if (survivors < config_.min_nodes || 2 * lost.size() > static_cast<size_t>(n)) {
    COHORT_LOG_WARN(kLog, "round {}: {} of {} nodes look lost; not carrying the survivors "
                    "(they join round {})", round, lost.size(), n, round + 1);
    return Carried();
  }
  Published next;
  next.layout = info.layout.Without(lost);
  next.carried = MembersWithout(info, lost);
  next.tell_key = info.tell_key;
  next.pace = info.pace;  // the start pace: the formation's measure of the store
  int first = 0;  // the new group rank 0, in this round's ranks
  while (std::binary_search(lost.begin(), lost.end(), first)) ++first;
  if (first == 0) {
    next.master = info.master;
  } else {
    COHORT_ASSIGN_OR_RETURN(next.master, NodeOf(info, first + 1));
  }
  return Carried(Carry{next.layout.members, next.Encode(), 0});
}

// Protocol (a late node at a running round R of N < MAX nodes, N >= carry_start_nodes, that
// held no round of this job: it has no place in R's records):
//  1. Read R's layout (its members, and its carried members when R was carried), waiting for
//     it up to the layout grace (GraceDeadline) as R's own nodes do; none by then: join as
//     usual.
//  2. EndRound(R, join:<host>), and as its winner: MayCarry(R), then R + 1 closed with N + 1
//     nodes and its layout, written with `next` (EndRoundThen): R's, with this node appended
//     (its record inline, under a random token: the only place it has one). Every member of
//     R keeps its slot; this node is the last rank.
//  3. Lost the end to another node (another joiner, a failure): nullopt (wait it out, join).
// Several nodes arriving at once thus join one at a time (each carries the round the one
// before it formed); the round's own nodes never join again.
Result<std::optional<RendezvousInfo>> Rendezvous::JoinCarried(int64_t round, int64_t members,
                                                              int64_t restarts) {
  using Taken = std::optional<RendezvousInfo>;
  if (!Carries(members) || members >= config_.max_nodes) return Taken();
  // A wait, as a member of the round waits for its layout: a round just closed has none
  // until its slot 1 publishes it (seconds on a loaded etcd), and a late node that ended it
  // meanwhile made every one of its nodes join again (10,000 at once, docs/scale.md). A
  // layout that does not come within the grace (a round closed by a store or client fault
  // between its keys) is ended for this node's join.
  COHORT_ASSIGN_OR_RETURN(std::optional<Published> read,
                          ReadPublished(round, 0, GraceDeadline(Deadline::Infinite())));
  if (!read || read->layout.members != members) return Taken();
  const Published& now = *read;
  Published next = now;
  next.layout.Append(self_.local_world_size);
  if (next.carried.records_round < 0) next.carried.records_round = round;
  next.carried.appended.push_back({RandomHex(16), self_});
  auto carry = [&]() -> std::optional<Carry> {
    auto may = MayCarry(round);
    if (!may.ok() || !*may) return std::nullopt;
    return Carry{next.layout.members, next.Encode(), restarts};  // a join counts no restart
  };
  COHORT_LOG_INFO(kLog, "round {} is running with room; joining it as its node {}", round,
                  members);
  const RendezvousInfo running = MakeInfo(round, 1, now, restarts);  // told (this node is none)
  COHORT_ASSIGN_OR_RETURN(Ended ended,
                          EndRoundThen(round, RoundEnd{RoundEnd::Kind::kJoin, self_.host},
                                       nullptr, members + 1, carry, {&running, -1}));
  if (!ended.carried) return Taken();
  COHORT_LOG_WARN(kLog, "round {}: carried its {} node(s) into round {} with this one",
                  round, members, round + 1);
  RendezvousInfo info = MakeInfo(round + 1, members + 1, std::move(next), restarts);
  last_round_ = round + 1;
  next_round_ = round + 2;
  held_ = info;
  return Taken(std::move(info));
}

void Rendezvous::Told(int64_t round, const RoundEnd& why) {
  told_round_ = round;
  told_ = why.carried;
}

// Protocol (a node that held round - 1, before joining `round`): the carried round its
// watcher was told with round - 1's end (Told), else one read of r<R>/layout, r<R>/next,
// `restarts` and `done`. A carried layout from the records round this node's
// round had, which has this node (SlotIn: by its records slot, or its token if appended):
// this node's round, no join. If that round already ended, the next one may be carried
// too: look at it the same way (held_ moves on, so a join that follows joins the round
// after the last one passed). Anything else (no layout yet, a joined round's, this node
// left out, the job over, the restart budget spent): nullopt, and Next joins as usual,
// which refuses or treats this node as late.
Result<std::optional<RendezvousInfo>> Rendezvous::TakeCarriedRound(int64_t round,
                                                                   Deadline deadline) {
  for (;;) {
    const RendezvousInfo& held = *held_;
    if (!Carries(held.group_world_size)) return std::optional<RendezvousInfo>();
    std::vector<std::optional<std::string>> now(4);  // layout, next, restarts, done
    if (told_ && told_round_ + 1 == round) {
      // Told with the end (the winner wrote it in `next`): no read. Whether this round
      // ended too is learned by its watcher's first beat, as any end.
      now[0] = std::move(told_->layout);
      now[2] = std::to_string(told_->restarts);
      told_.reset();
    } else {
      const std::vector<std::string> keys = {RoundKey(round, "layout"), RoundKey(round, "next"),
                                             Key("restarts"), Key("done")};
      COHORT_ASSIGN_OR_RETURN(now, RequestUntilDeadline(deadline, [&](Deadline d) {
                                return store_->Peek(keys, d);
                              }));
    }
    if (!now[0] || now[3]) return std::optional<RendezvousInfo>();
    COHORT_ASSIGN_OR_RETURN(Published published, Published::Decode(*now[0]));
    COHORT_ASSIGN_OR_RETURN(int64_t restarts, ParseRestarts(now[2]));
    if (published.carried.records_round < 0 || restarts > config_.max_restarts) {
      return std::optional<RendezvousInfo>();
    }
    const std::optional<int64_t> slot =
        SlotIn(published.carried, published.layout.members, held);
    if (!slot) {
      COHORT_LOG_WARN(kLog, "round {} was carried without this node (taken for lost); "
                      "joining as a late node", round);
      return std::optional<RendezvousInfo>();
    }
    RendezvousInfo info = MakeInfo(round, *slot, std::move(published), restarts);
    last_round_ = round;
    next_round_ = round + 1;
    held_ = info;
    if (!now[1]) return std::optional<RendezvousInfo>(std::move(info));
    ++round;  // it ended already: the next one may be carried too
  }
}

}  // namespace cohort::rendezvous
