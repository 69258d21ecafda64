// Implements the round's watcher thread (round_watcher.h).
#include "cohort/agent/round_watcher.h"

#include <pthread.h>

#include "cohort/base/log.h"

namespace cohort::agent {

namespace {
constexpr const char* kLog = "agent";
}  // namespace

RoundWatcher::RoundWatcher(const AgentOptions& o, const rendezvous::RendezvousInfo& info,
                           std::shared_ptr<rendezvous::RoundTell> tell)
    : tell_(std::move(tell)) {
  if (o.rdzv.max_nodes <= 1) return;
  auto ws = o.connect_store();
  if (!ws.ok()) {
    COHORT_LOG_WARN(kLog, "no watcher connection: {}", ws.status().message());
    return;
  }
  store_ = *ws;
  thread_ = std::thread([this, &o, info] { Watch(o, info); });
}

void RoundWatcher::Watch(const AgentOptions& o, const rendezvous::RendezvousInfo& info) {
  pthread_setname_np(pthread_self(), "rdzv-watch");
  rendezvous::Rendezvous watch(store_, o.rdzv, o.self);
  watch.UseTell(tell_);
  while (!stop_) {
    auto ended = watch.WatchStep(info, beating_.load());
    if (stop_) return;
    if (!ended.ok()) {
      COHORT_LOG_WARN(kLog, "lost the rendezvous store: {}", ended.status().message());
      ended_.Notify();
      return;
    }
    if (ended->has_value()) {
      COHORT_LOG_INFO(kLog, "round {} ended: {}", info.round, (*ended)->Describe());
      {
        MutexLock lock(&mu_);
        why_ = **ended;
      }
      ended_.Notify();
      return;
    }
  }
}

RoundWatcher::~RoundWatcher() {
  if (!thread_.joinable()) return;
  stop_ = true;
  store_->Abort();
  if (tell_) tell_->Cancel();
  thread_.join();
  if (tell_) tell_->Uncancel();  // the next round's watcher waits on it again
}

}  // namespace cohort::agent
