// Carried rounds (RendezvousConfig::carry_start_nodes; docs/rendezvous.md): a large round
// that loses a node is followed by a round of its survivors that nobody joins. The node
// that ends the round for the lost node closes the next one and publishes its layout
// (CarryRound, before the end's `next` is written); each survivor then takes it with one
// read (TakeCarriedRound, from Next) and keeps its order. Joining was the cost: at 10,000
// nodes on etcd every node's join txn and layout watch at once after each loss, which
// took longer than the round before it and made etcd lose its leader (docs/scale.md).
// Thread-safety: see rendezvous.h; this file keeps no global state.
#include <algorithm>

#include "cohort/base/log.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/rendezvous/rendezvous_internal.h"

namespace cohort::rendezvous {

// Who is lost with `dead_slot`: every node whose beat counter the store dates as older
// than two beat periods (a live node beats every period; the store's own dating, so no
// watcher's lateness counts), found in one read; nodes killed together with the dead one
// are thus left out of the same carried round, not found one dead timeout later each.
// Group ranks, ascending.
static std::vector<int> LostWith(store::Store& store, const std::vector<std::string>& beats,
                                 int self_slot, int dead_slot, Duration quiet_for,
                                 int64_t round) {
  std::vector<int> lost = {dead_slot - 1};
  auto silent = store.Silent(beats, quiet_for, Deadline::After(kCallTimeout));
  if (!silent.ok()) {
    COHORT_LOG_INFO(kLog, "round {}: the store does not say which other nodes are silent ({}); "
                    "leaving out the lost node only", round, silent.status().ToString());
    return lost;
  }
  for (int slot = 1; slot <= static_cast<int>(silent->size()); ++slot) {
    if ((*silent)[slot - 1] && slot != self_slot && slot != dead_slot) lost.push_back(slot - 1);
  }
  std::sort(lost.begin(), lost.end());
  return lost;
}

// Protocol (the winner of the round's end, before it writes `next`):
//  1. Carry only a round of at least carry_start_nodes in which no node finished
//     (r<R>/finished) and no warm spare waits (`standby`: a spare takes a lost node's place
//     in a joined round), with at least MIN survivors, and at most half the nodes lost
//     (more is a store or network fault, not lost nodes: join as usual).
//  2. Lost: the dead peer and every node silent with it (LostWith; not on leases, whose
//     keys the store keeps alive without writes).
//  3. CompareSet(r<R+1>/closed, "", survivors): nobody can join R+1 (a node that arrives
//     finds it running and asks for a re-rendezvous, as a late node).
//  4. CompareSet(r<R+1>/layout, "", layout): R's layout without the lost ranks, the new
//     group rank 0's record (read from the records round when node 0 was lost), and the
//     records round with the slots of it left out.
Result<bool> Rendezvous::CarryRound(const RendezvousInfo& info, int dead_slot) {
  const int n = info.group_world_size;
  const int64_t round = info.round;
  if (config_.carry_start_nodes <= 0 || n < config_.carry_start_nodes) return false;
  COHORT_ASSIGN_OR_RETURN(auto state, store_->Peek({RoundKey(round, "finished"), Key("standby"),
                                                    Key("done")},
                                                   CallDeadline()));
  if (state[0] || state[1] || state[2]) return false;
  std::vector<int> lost = {dead_slot - 1};
  if (!leased_) {
    std::vector<std::string> beats;
    beats.reserve(n);
    for (int slot = 1; slot <= n; ++slot) beats.push_back(RoundKey(round, fmt::format("hb{}", slot)));
    lost = LostWith(*store_, beats, info.slot, dead_slot, 2 * BeatPeriod(info), round);
  }
  const int survivors = n - static_cast<int>(lost.size());
  if (survivors < config_.min_nodes || 2 * lost.size() > static_cast<size_t>(n)) {
    COHORT_LOG_WARN(kLog, "round {}: {} of {} nodes look lost; not carrying the survivors "
                    "(they join round {})", round, lost.size(), n, round + 1);
    return false;
  }
  Published next;
  next.layout = info.layout.Without(lost);
  next.records_round = info.RecordsRound();
  next.left_out = info.left_out;
  for (int g : lost) next.left_out.push_back(info.RecordSlot(g + 1));
  std::sort(next.left_out.begin(), next.left_out.end());
  int first = 0;  // the new group rank 0, in this round's ranks
  while (std::binary_search(lost.begin(), lost.end(), first)) ++first;
  if (first == 0) {
    next.master = info.master;
  } else {
    const int64_t records = next.records_round;
    COHORT_ASSIGN_OR_RETURN(auto record,
                            store_->ReadAppended(RoundKey(records, "slot"),
                                                 RoundKey(records, "node"),
                                                 info.RecordSlot(first + 1), 1, CallDeadline()));
    if (record.empty()) return DataLoss("round {} has no record of its node {}", records, first);
    COHORT_ASSIGN_OR_RETURN(next.master, NodeInfo::FromJson(record[0]));
  }
  const Deadline until = Deadline::After(config_.layout_grace);
  const std::string count = std::to_string(survivors);
  COHORT_ASSIGN_OR_RETURN(std::string closed, RequestUntilDeadline(until, [&](Deadline d) {
                            return store_->CompareSet(RoundKey(round + 1, "closed"), "", count, d);
                          }));
  if (closed != count) {
    return FailedPrecondition("round {} was closed already, with {}", round + 1, closed);
  }
  COHORT_RETURN_IF_ERROR(RequestUntilDeadline(until, [&](Deadline d) {
                           return store_->CompareSet(RoundKey(round + 1, "layout"), "",
                                                     next.Encode(), d);
                         }).status());
  COHORT_LOG_WARN(kLog, "round {}: carried its {} surviving node(s) into round {} ({} left out)",
                  round, survivors, round + 1, lost.size());
  return true;
}

// Protocol (a node that held round - 1, before joining `round`): one read of r<R>/layout,
// r<R>/next, `restarts` and `done`. A carried layout from the records round this node's
// round had, which does not leave this node out: this node's round, its slot its rank
// among the records round's slots not left out (one read, no join). If that round already
// ended, the next one may be carried too: look at it the same way (held_ moves on, so a
// join that follows joins the round after the last one passed). Anything else (no layout
// yet, a joined round's, this node left out, the job over, the restart budget spent):
// nullopt, and Next joins as usual, which refuses or treats this node as late.
Result<std::optional<RendezvousInfo>> Rendezvous::TakeCarriedRound(int64_t round,
                                                                   Deadline deadline) {
  for (;;) {
    const RendezvousInfo& held = *held_;
    if (config_.carry_start_nodes <= 0 || held.group_world_size < config_.carry_start_nodes) {
      return std::optional<RendezvousInfo>();
    }
    const std::vector<std::string> keys = {RoundKey(round, "layout"), RoundKey(round, "next"),
                                           Key("restarts"), Key("done")};
    COHORT_ASSIGN_OR_RETURN(auto now, RequestUntilDeadline(deadline, [&](Deadline d) {
                              return store_->Peek(keys, d);
                            }));
    if (!now[0] || now[3]) return std::optional<RendezvousInfo>();
    COHORT_ASSIGN_OR_RETURN(Published published, Published::Decode(*now[0]));
    COHORT_ASSIGN_OR_RETURN(int64_t restarts, ParseCounter(now[2], "restarts"));
    const int record = held.RecordSlot(held.slot);
    const auto& out = published.left_out;
    if (published.records_round != held.RecordsRound() || restarts > config_.max_restarts) {
      return std::optional<RendezvousInfo>();
    }
    if (std::binary_search(out.begin(), out.end(), record)) {
      COHORT_LOG_WARN(kLog, "round {} was carried without this node (taken for lost); "
                      "joining as a late node", round);
      return std::optional<RendezvousInfo>();
    }
    const int64_t slot =
        record - (std::lower_bound(out.begin(), out.end(), record) - out.begin());
    RendezvousInfo info = MakeInfo(round, slot, std::move(published), restarts);
    last_round_ = round;
    next_round_ = round + 1;
    held_ = info;
    if (!now[1]) return std::optional<RendezvousInfo>(std::move(info));
    ++round;  // it ended already: the next one may be carried too
  }
}

}  // namespace cohort::rendezvous
