// Implements the agent's side of live reconfiguration (live_reconfig.h). Single-threaded:
// only the agent's monitor thread calls in.
#include "cohort/agent/live_reconfig.h"

#include <filesystem>

#include "cohort/base/file.h"
#include "cohort/base/log.h"
#include "cohort/base/strings.h"

namespace cohort::agent {

namespace fs = std::filesystem;
using rendezvous::RendezvousInfo;
using rendezvous::RoundEnd;

namespace {
constexpr const char* kLog = "agent";
}  // namespace

LiveReconfig::LiveReconfig(bool offered, int min_nodes, Duration reform_timeout)
    : offered_(offered), min_nodes_(min_nodes), reform_timeout_(reform_timeout),
      secret_(RandomHex(16)) {}

LiveReconfig::~LiveReconfig() { CloseChannel(); }

const std::string& LiveReconfig::MakeRuntimeDir() {
  // Removed by the sweeper's helper when the agent ends, however it ends.
  if (!offered_ || !runtime_dir_.empty()) return runtime_dir_;
  auto dir = MakePrivateDir("", "cohort-agent-");
  if (dir.ok()) {
    runtime_dir_ = *dir;
  } else {
    COHORT_LOG_WARN(kLog, "no private runtime directory ({}): workers will be restarted on "
                    "a membership change", dir.status().message());
  }
  return runtime_dir_;
}

void LiveReconfig::OpenChannel() {
  if (!offered_) return;
  // A private directory (mkdtemp: mode 0700, a name nobody can predict or prepare) in the
  // agent's private runtime directory, one per worker group; removed with the group, and
  // with the runtime directory should the agent be killed.
  auto dir = runtime_dir_.empty()
                 ? Result<std::string>(FailedPrecondition("no private runtime directory"))
                 : MakePrivateDir(runtime_dir_, "membership-");
  auto watch = dir.ok() ? membership_channel::ChannelWatch::Open(*dir)
                        : Result<std::unique_ptr<membership_channel::ChannelWatch>>(dir.status());
  if (!watch.ok()) {
    if (dir.ok()) {
      std::error_code ec;
      fs::remove_all(*dir, ec);
    }
    COHORT_LOG_WARN(kLog, "no membership channel ({}): workers will be restarted on a "
                    "membership change", watch.status().message());
    return;
  }
  dir_ = *dir;
  channel_ = std::move(*watch);
}

void LiveReconfig::CloseChannel() {
  channel_.reset();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  dir_.clear();
  reform_deadline_.reset();
}

int LiveReconfig::fd() const { return channel_ ? channel_->fd() : -1; }

bool LiveReconfig::Keeps(const RoundEnd& why, const RendezvousInfo& info,
                         const WorkerGroup& group) const {
  if (dir_.empty() || group.workers().empty()) return false;
  if (why.kind != RoundEnd::Kind::kJoin && why.kind != RoundEnd::Kind::kDeadNode) return false;
  // Fewer than MIN nodes left: the job waits for nodes, without workers (as torchrun).
  if (why.kind == RoundEnd::Kind::kDeadNode && info.group_world_size - 1 < min_nodes_) {
    return false;
  }
  for (const auto& w : group.workers()) {
    if (!w.alive || !membership_channel::IsReady(dir_, w.local_rank)) return false;
  }
  return true;
}

Status LiveReconfig::Announce(const RendezvousInfo& info,
                              const std::pair<std::string, int>& master, WorkerGroup& group) {
  group.Renumber(info.RankOffset());
  for (const auto& w : group.workers()) {
    COHORT_RETURN_IF_ERROR(membership_channel::WriteNotice(
        dir_, w.local_rank,
        MembershipNotice{.round = info.round,
                         .rank = w.rank,
                         .world_size = info.WorldSize(),
                         .group_rank = info.group_rank,
                         .group_world_size = info.group_world_size,
                         .store_prefix = info.store_prefix,
                         .restart_count = info.restart_count,
                         .master_addr = master.first,
                         .master_port = master.second},
        secret_));
  }
  reform_started_ = SteadyClock::now();
  reform_deadline_ = Deadline::After(reform_timeout_);
  ++reforms_;  // counted once announced: a failed announcement restarts them instead
  return Status::Ok();
}

std::optional<LostPeerReport> LiveReconfig::Read(int64_t round, const WorkerGroup& group,
                                                 const std::function<void(double)>& on_formed) {
  bool lost = false, formed = false;
  for (const auto& [file, local] : channel_->Changed()) {
    lost |= file == membership_channel::File::kLost;
    formed |= file == membership_channel::File::kFormed;
  }
  for (const auto& w : group.workers()) {
    if (!lost) break;
    auto report = membership_channel::ReadLost(dir_, w.local_rank, secret_);
    if (!report.ok() && report.status().code() != StatusCode::kNotFound) {
      COHORT_LOG_WARN(kLog, "local rank {}: {}", w.local_rank, report.status().message());
    }
    // Reports of an earlier round come from a worker that had not yet seen the new one.
    if (report.ok() && report->round == round) return *report;
  }
  if (formed && reform_deadline_) {
    bool all = true;
    for (const auto& w : group.workers()) {
      all = all && membership_channel::ReadFormed(dir_, w.local_rank) == round;
    }
    if (all) {
      on_formed(SecondsSince(reform_started_) * 1000);
      reform_deadline_.reset();
    }
  }
  return std::nullopt;
}

int LiveReconfig::ReformTimeoutMs() const {
  return reform_deadline_ ? reform_deadline_->PollTimeoutMs() : -1;
}

bool LiveReconfig::ReformTimedOut() const {
  return reform_deadline_ && reform_deadline_->expired();
}

}  // namespace cohort::agent
