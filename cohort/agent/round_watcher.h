// The round's watcher: a thread ("rdzv-watch") that sends this node's heartbeats and waits
// for the round to end elsewhere (a join, a dead node, a failure), on a store connection of
// its own. Started only when other nodes may exist.
//
// Thread-safety: the owner (the agent's monitor thread) constructs, reads fd()/why(),
// calls StopBeating() and destroys it; the watcher thread shares with it only an eventfd,
// two atomics and why_ under a mutex. The destructor aborts the watcher's store connection
// and its wait for a told end (RoundTell::Cancel), joins the thread, then clears the cancel.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "cohort/agent/agent.h"
#include "cohort/base/event_fd.h"
#include "cohort/base/mutex.h"
#include "cohort/rendezvous/rendezvous.h"

namespace cohort::agent {

class RoundWatcher {
 public:
  // `tell` (may be null): the agent's socket for told ends (Rendezvous::UseTell).
  RoundWatcher(const AgentOptions& o, const rendezvous::RendezvousInfo& info,
               std::shared_ptr<rendezvous::RoundTell> tell);
  ~RoundWatcher();
  RoundWatcher(const RoundWatcher&) = delete;
  RoundWatcher& operator=(const RoundWatcher&) = delete;

  // No more beats from the next step on (the node is about to write "finished" into its
  // counter, which a beat could no longer add to); it keeps watching.
  void StopBeating() { beating_ = false; }
  // Readable once the round ended elsewhere or the store was lost; -1 when nothing watches.
  int fd() const { return thread_.joinable() ? ended_.fd() : -1; }
  // Why the round ended, once fd() fired (nullopt: the store was lost).
  std::optional<rendezvous::RoundEnd> why() const {
    MutexLock lock(&mu_);
    return why_;
  }

 private:
  void Watch(const AgentOptions& o, const rendezvous::RendezvousInfo& info);

  mutable Mutex mu_;
  std::optional<rendezvous::RoundEnd> why_ COHORT_GUARDED_BY(mu_);
  EventFd ended_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> beating_{true};
  std::shared_ptr<store::Store> store_;
  std::shared_ptr<rendezvous::RoundTell> tell_;
  std::thread thread_;
};

}  // namespace cohort::agent
