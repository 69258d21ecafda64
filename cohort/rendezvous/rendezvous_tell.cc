// Told ends (rendezvous.h, round_tell.h): the winner of a large quiet round's end sends it to
// every node of the round by datagram, and a resting watcher wakes on it; what decides
// whether a round is told.
// Thread-safety: see rendezvous.h (each Rendezvous is used by one thread; the RoundTell
// they share is safe to send on from any thread); this file keeps no global state.
#include "cohort/base/log.h"
#include "cohort/rendezvous/rendezvous.h"
#include "cohort/rendezvous/rendezvous_internal.h"

namespace cohort::rendezvous {

// How long the winner of an end may spend reading the round's records to tell its nodes (at
// 10,000 nodes on etcd: ten range reads); past it they learn the end at their next beat.
constexpr auto kTellReadTimeout = std::chrono::seconds(10);

void Rendezvous::UseTell(std::shared_ptr<RoundTell> tell) {
  tell_ = std::move(tell);
  self_.tell_port = tell_ ? tell_->port() : 0;
}

bool Rendezvous::TellsEnd(const RendezvousInfo& info) const {
  const int n = info.group_world_size;
  return tell_ && !info.tell_key.empty() && config_.tell_start_nodes > 0 &&
         n >= config_.tell_start_nodes && n >= config_.quiet_start_nodes;
}

// Only on a store where a large round's nodes rest between their beats (Store::Idle):
// elsewhere their wait on the store tells them at once. (At 10,000 nodes on etcd the read
// took 0.7 s of the 3 s between the winner's claim and its `next`: read alongside.)
std::future<Rendezvous::Nodes> Rendezvous::ReadForTell(const RendezvousInfo& info) {
  if (!TellsEnd(info) ||
      store_->Idle(Deadline::AfterMs(0)).code() == StatusCode::kFailedPrecondition) {
    return {};
  }
  return std::async(std::launch::async, [this, info] {
    return RoundNodes(info, Deadline::After(kTellReadTimeout));
  });
}

void Rendezvous::TellEnd(const RendezvousInfo& info, std::string_view end, int skip,
                         std::future<Nodes> read) {
  const auto start = SteadyClock::now();
  Nodes nodes = read.get();
  const double read_s = SecondsSince(start);
  if (!nodes.ok()) {
    COHORT_LOG_WARN(kLog, "round {}: could not read its nodes' records to tell them its end "
                    "({}); they learn it at their next beat", info.round,
                    nodes.status().ToString());
    return;
  }
  std::vector<RoundTell::Peer> to;
  to.reserve(nodes->size());
  for (size_t g = 0; g < nodes->size(); ++g) {
    const NodeInfo& node = (*nodes)[g];
    if (static_cast<int>(g) != skip && node.tell_port > 0) to.push_back({node.addr, node.tell_port});
  }
  const int sent = tell_->Send(config_.run_id, info.round, info.tell_key, end, to);
  const double took = SecondsSince(start);
  log::Get(kLog)->log(LevelOfEndTaking(took),
                      "round {}: told its end to {} of its {} other nodes by datagram in "
                      "{:.2f} s (waited {:.2f} s for their records)", info.round, sent,
                      info.group_world_size - (skip >= 0 ? 1 : 0), took, read_s);
}

Result<std::optional<RoundEnd>> Rendezvous::RestIdle(const RendezvousInfo& info, Deadline wake) {
  const bool told = TellsEnd(info);
  // (Where the round is told, a wait that ends at once: whether the store rests at all.)
  COHORT_RETURN_IF_ERROR(store_->Idle(told ? Deadline::AfterMs(0) : wake));
  if (!told) return std::optional<RoundEnd>();
  COHORT_ASSIGN_OR_RETURN(auto end, tell_->Await(config_.run_id, info.round, info.tell_key, wake));
  if (!end) return std::optional<RoundEnd>();
  COHORT_LOG_INFO(kLog, "round {}: told its end by datagram", info.round);
  return std::optional<RoundEnd>(RoundEnd::Decode(*end));
}

}  // namespace cohort::rendezvous
