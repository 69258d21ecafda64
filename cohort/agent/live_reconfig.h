// The agent's side of live reconfiguration (docs/multinode.md): the membership channel of
// the running worker group (a private directory watched with inotify, messages signed with
// a per-agent secret; base/membership_channel.h), whether a round's end keeps the workers,
// the announcement of the new round to kept workers, the deadline by which they must have
// re-formed, and the lost-peer reports they send.
//
// Thread-safety: none. The agent's monitor thread owns it; the workers are other processes
// and reach it only through the channel's files.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cohort/agent/worker_group.h"
#include "cohort/base/membership_channel.h"
#include "cohort/base/time.h"
#include "cohort/rendezvous/rendezvous.h"

namespace cohort::agent {

class LiveReconfig {
 public:
  // `offered`: the job may span nodes and live reconfiguration is not switched off;
  // `min_nodes`: fewer nodes than this after a loss and the workers are not kept.
  LiveReconfig(bool offered, int min_nodes, Duration reform_timeout);
  ~LiveReconfig();
  LiveReconfig(const LiveReconfig&) = delete;
  LiveReconfig& operator=(const LiveReconfig&) = delete;

  // The agent's private runtime directory (0700), once per agent; empty when not offered
  // or it cannot be made (then workers are restarted on every membership change).
  const std::string& MakeRuntimeDir();
  // A channel for a new worker group, in the runtime directory; on an error the workers are
  // not offered one.
  void OpenChannel();
  // Closes the channel and removes its directory (the group was stopped).
  void CloseChannel();
  bool open() const { return channel_ != nullptr; }
  // The channel's directory and secret for the workers' environment (empty: none).
  const std::string& dir() const { return dir_; }
  const std::string& secret() const { return secret_; }
  // The inotify fd to poll while the group runs (-1: no channel).
  int fd() const;

  // Whether the workers stay through the end of the round for `why`: a join or a dead node,
  // every local worker alive and ready, and enough nodes left.
  bool Keeps(const rendezvous::RoundEnd& why, const rendezvous::RendezvousInfo& info,
             const WorkerGroup& group) const;
  // Tells each kept worker its place in round `info` (renumbering the group) and starts the
  // re-formation deadline. An error: a notice could not be written.
  Status Announce(const rendezvous::RendezvousInfo& info,
                  const std::pair<std::string, int>& master, WorkerGroup& group);
  // Reads the channel after its fd fired: a lost-peer report of round `round` ends the
  // round; notes when every worker formed in the announced round (`on_formed`, with the
  // milliseconds it took).
  std::optional<LostPeerReport> Read(int64_t round, const WorkerGroup& group,
                                     const std::function<void(double)>& on_formed);
  // While announced workers have not re-formed: how long the monitor loop may sleep (-1:
  // no deadline) and whether the deadline passed.
  int ReformTimeoutMs() const;
  bool ReformTimedOut() const;
  // Rounds the workers joined in place (announced to them).
  int64_t reforms() const { return reforms_; }

 private:
  const bool offered_;
  const int min_nodes_;
  const Duration reform_timeout_;
  const std::string secret_;
  std::string runtime_dir_;
  std::string dir_;
  std::unique_ptr<membership_channel::ChannelWatch> channel_;
  std::optional<Deadline> reform_deadline_;
  SteadyClock::time_point reform_started_;
  int64_t reforms_ = 0;
};

}  // namespace cohort::agent
