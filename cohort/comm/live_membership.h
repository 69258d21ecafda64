// LiveMembership: a worker's side of live reconfiguration (docs/multinode.md, "Live
// reconfiguration"). Under `cohort run` on several nodes the agent offers a membership
// channel (base/membership_channel.h). A program that starts a LiveMembership declares that
// it re-forms in place; it then learns of a new membership the moment its agent announces
// it (the communicator is interrupted at once, so a step blocked on a peer that went away
// returns), and re-forms its communicator there, keeping its process and memory.
//
//   auto live = LiveMembership::Start(env, comm.get()).value();  // null: not offered
//   Status st = step();                                          // collectives
//   if (live && (!st.ok() || live->Pending())) {
//     live->AwaitChange(st, deadline);  // a lost peer is reported to the agent
//     live->Reform(deadline);           // now rank comm->rank() of comm->size()
//   }
//
// Thread-safety: the methods are for the thread that owns the communicator. A watcher
// thread of the object's own (inotify on the channel) records the newest notice, interrupts
// the communicator and aborts a formation that a newer notice made stale; the two share
// the state below under mu_.
#pragma once

#include <memory>
#include <optional>
#include <thread>

#include "cohort/base/event_fd.h"
#include "cohort/base/membership_channel.h"
#include "cohort/base/mutex.h"
#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/comm/communicator.h"

namespace cohort::comm {

class LiveMembership {
 public:
  // Declares support (ready.L) and starts watching; nullptr when the agent offers no
  // channel (not under `cohort run` on several nodes, or COHORT_LIVE_RECONFIG=0).
  // `comm` must outlive the object.
  static Result<std::unique_ptr<LiveMembership>> Start(const WorkerEnv& env, Communicator* comm);
  ~LiveMembership();
  LiveMembership(const LiveMembership&) = delete;
  LiveMembership& operator=(const LiveMembership&) = delete;

  // The round the communicator is formed in now.
  int64_t round() const { return round_; }
  // A membership newer than round(), once the agent announced one.
  std::optional<MembershipNotice> Pending() const;
  // After an operation failed with `why` (or Pending() said so): unless a notice caused it
  // (kAborted), tells the agent a peer went away (lost.L). Then waits for a membership newer
  // than round() until `deadline`.
  Result<MembershipNotice> AwaitChange(const Status& why, Deadline deadline);
  // Re-forms the communicator in the newest announced membership by `deadline` and tells
  // the agent (formed.L); a newer notice arriving meanwhile restarts it there. When the
  // group does not form, round() is the failed round and the error is returned: call
  // AwaitChange with it (the agent ends that round) and Reform again.
  Status Reform(Deadline deadline);

 private:
  LiveMembership(WorkerEnv env, Communicator* comm);
  void Watch(std::unique_ptr<membership_channel::ChannelWatch> channel);
  // Reads notice.L; records it and interrupts when it is newer than what was seen.
  void OnNotice();

  const WorkerEnv env_;
  Communicator* const comm_;
  int64_t round_;  // owner thread only
  mutable Mutex mu_;
  CondVar changed_;  // a newer notice arrived
  std::optional<MembershipNotice> newest_ COHORT_GUARDED_BY(mu_);
  // The store connection a Reform in progress forms through, and its round: a newer notice
  // aborts it so the formation returns at once.
  std::shared_ptr<store::Store> forming_store_ COHORT_GUARDED_BY(mu_);
  int64_t forming_round_ COHORT_GUARDED_BY(mu_) = -1;
  EventFd stop_;
  std::thread watcher_;
};

}  // namespace cohort::comm
