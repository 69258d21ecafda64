// LiveMembership (see live_membership.h): the channel's worker side and its watcher thread.
#include "cohort/comm/live_membership.h"

#include <poll.h>
#include <unistd.h>

#include "cohort/base/log.h"
#include "cohort/metrics/exporter.h"

namespace cohort::comm {

namespace mc = membership_channel;

namespace {
constexpr const char* kLog = "live";
}

LiveMembership::LiveMembership(WorkerEnv env, Communicator* comm)
    : env_(std::move(env)), comm_(comm), round_(env_.round) {}

Result<std::unique_ptr<LiveMembership>> LiveMembership::Start(const WorkerEnv& env,
                                                               Communicator* comm) {
  if (env.membership_dir.empty() || comm == nullptr) return std::unique_ptr<LiveMembership>();
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<mc::ChannelWatch> channel,
                          mc::ChannelWatch::Open(env.membership_dir));
  std::unique_ptr<LiveMembership> live(new LiveMembership(env, comm));
  live->OnNotice();  // one written before the watch began
  COHORT_RETURN_IF_ERROR(mc::MarkReady(env.membership_dir, env.local_rank));
  live->watcher_ = std::thread(
      [raw = live.get(), ch = std::move(channel)]() mutable { raw->Watch(std::move(ch)); });
  return live;
}

LiveMembership::~LiveMembership() {
  if (!watcher_.joinable()) return;
  stop_.Notify();
  watcher_.join();
}

void LiveMembership::Watch(std::unique_ptr<mc::ChannelWatch> channel) {
  pthread_setname_np(pthread_self(), "live-watch");
  for (;;) {
    pollfd fds[2] = {{channel->fd(), POLLIN, 0}, {stop_.fd(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents) break;
    bool notice = false;
    for (const auto& [file, local] : channel->Changed()) {
      notice |= file == mc::File::kNotice && local == env_.local_rank;
    }
    if (notice) OnNotice();
  }
}

void LiveMembership::OnNotice() {
  Result<MembershipNotice> n = mc::ReadNotice(env_.membership_dir, env_.local_rank, env_.membership_secret);
  if (!n.ok()) {
    if (n.status().code() != StatusCode::kNotFound) {
      COHORT_LOG_WARN(kLog, "ignoring the membership notice: {}", n.status().message());
    }
    return;
  }
  MutexLock lock(&mu_);
  const int64_t seen = newest_ ? newest_->round : env_.round;
  if (n->round <= seen) return;
  COHORT_LOG_INFO(kLog, "round {}: this worker becomes rank {} of {}", n->round, n->rank,
                  n->world_size);
  // Under mu_, before the owner can see the notice: the interrupt hits the group formed
  // (or forming) before it, never the one the owner then forms for it.
  comm_->Interrupt(fmt::format("round {} has {} rank(s)", n->round, n->world_size));
  if (forming_store_ && forming_round_ < n->round) forming_store_->Abort();
  newest_ = *n;
  changed_.SignalAll();
}

std::optional<MembershipNotice> LiveMembership::Pending() const {
  MutexLock lock(&mu_);
  if (newest_ && newest_->round > round_) return newest_;
  return std::nullopt;
}

Result<MembershipNotice> LiveMembership::AwaitChange(const Status& why, Deadline deadline) {
  if (auto pending = Pending()) return *pending;
  if (!why.ok() && why.code() != StatusCode::kAborted) {
    // A transport failure without a notice: a peer went away. The agent ends the round so
    // that the survivors form a new one.
    COHORT_LOG_WARN(kLog, "round {}: {}; asking the agent for a new membership", round_,
                    why.message());
    COHORT_RETURN_IF_ERROR(mc::WriteLost(
        env_.membership_dir, env_.local_rank,
        LostPeerReport{.round = round_, .rank = comm_->rank(), .reason = why.message(),
                       .peer = LostPeerIn(why.message())},
        env_.membership_secret));
  }
  MutexLock lock(&mu_);
  while (!(newest_ && newest_->round > round_)) {
    if (!changed_.WaitUntil(&mu_, deadline)) {
      return DeadlineExceeded("no new membership announced by the agent after: {}",
                              why.ok() ? std::string("a notice") : why.message());
    }
  }
  return *newest_;
}

Status LiveMembership::Reform(Deadline deadline) {
  for (;;) {
    std::optional<MembershipNotice> target = Pending();
    if (!target) return FailedPrecondition("no new membership to re-form in");
    // A connection of its own per formation: a newer notice aborts it (OnNotice).
    COHORT_ASSIGN_OR_RETURN(std::shared_ptr<store::Store> connection,
                            ConnectJobStore(env_.store, deadline));
    {
      MutexLock lock(&mu_);
      forming_store_ = connection;
      forming_round_ = target->round;
      if (newest_->round > target->round) continue;  // superseded before it began
    }
    auto scoped = std::make_shared<store::PrefixStore>(target->store_prefix, connection);
    Status st = comm_->Reform(scoped, target->rank, target->world_size, deadline);
    bool superseded;
    {
      MutexLock lock(&mu_);
      forming_store_.reset();
      superseded = newest_->round > target->round;
    }
    if (superseded) {
      COHORT_LOG_INFO(kLog, "round {} was superseded while forming; re-forming in the newer",
                      target->round);
      continue;
    }
    // On a failure too the group of round() is the one that did not form: AwaitChange then
    // reports it to the agent, which ends that round.
    round_ = target->round;
    if (!st.ok()) return st;
    metrics::SetExportedRank(target->rank);  // the worker's snapshots follow its new rank
    return mc::WriteFormed(env_.membership_dir, env_.local_rank, round_);
  }
}

}  // namespace cohort::comm
