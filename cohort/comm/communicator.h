// Communicator: collective communication among the ranks of a job (libcohort).
//
//   auto comm = Communicator::Create(store, rank, size, {}).value();
//   comm->AllReduce(grad.data(), grad.data(), grad.size(), DataType::kF32, ReduceOp::kAvg)
//       ->Wait(Deadline::AfterMs(60000));
//
// Setup: ranks publish their host id (hostname + boot id, or options.host_id) through the
// store; ranks on one host share a memory segment (ShmGroup), and every rank has a TCP
// connection to every other (TcpMesh). Algorithm choice by size and topology (see
// docs/collectives.md), overridable with COHORT_ALGO.
//
// Ordering: every operation gets the next sequence number when issued and operations run in
// issue order. kInline operations run on the caller's thread (after any queued async ones);
// kAsync operations run on the communicator's "comm-worker" thread and complete through
// their Work handle. Every rank must issue the same collectives in the same order; a
// mismatch fails on every rank that sees it, naming both ranks and operations.
//
// Failure: a dead or stuck peer makes the operation fail within the timeout with an error
// that names the peer; the communicator is then broken (later operations fail at once with
// the first error). Abort() unblocks every rank-local wait. The flight recorder is dumped
// on timeout, on abort and on SIGUSR1.
//
// Thread-safety: all methods may be called from any thread; issue order is the order in
// which calls acquire the internal queue lock.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/comm/dtype.h"
#include "cohort/comm/op.h"
#include "cohort/store/job_store_access.h"
#include "cohort/store/store.h"

namespace cohort::comm {

struct CommOptions {
  std::string name = "default";   // distinguishes communicators of one job in the store
  std::string host_id;            // empty: COHORT_HOST_ID, else hostname + boot id
  std::string transport;          // "", "auto", "shm" (same-host only) or "tcp"
  std::string algo;               // empty: COHORT_ALGO, else by size and topology
  Duration timeout{0};  // per operation; 0: COHORT_COMM_TIMEOUT (seconds) or 300 s
  size_t shm_slot_bytes = 0;      // 0: COHORT_SHM_SLOT_BYTES or 256 KiB
  size_t flight_recorder = 64;    // entries kept
  std::string listen_addr;        // address peers reach this rank at (default: hostname's)
  std::string flight_recorder_dir;  // where a timeout or abort dumps the flight record
  // The job's cookie (COHORT_JOB_COOKIE): shared-memory segments carry it in their names,
  // so the agent removes what a killed worker left (base/sweeper.h).
  std::string job_cookie;
};

// Options left empty take the launcher's choices from the worker environment: the address
// this node's peers reach it at (COHORT_LISTEN_ADDR, from `cohort run --local-addr`) and
// the flight-recorder directory.
void ApplyWorkerEnv(const WorkerEnv& env, CommOptions& options);

// A new connection to the job's store that the worker environment names (a cohort store or
// etcd), by `deadline`; not narrowed to a round (store/job_store_access.h).
using store::ConnectJobStore;

enum class Exec { kInline, kAsync };

class Work {
 public:
  // Waits until the operation finished (kDeadlineExceeded if `deadline` passes first; the
  // operation keeps running) and returns its status.
  Status Wait(Deadline deadline = Deadline::Infinite());
  bool IsCompleted() const;

 private:
  friend class Communicator;
  mutable Mutex mu_;
  CondVar cv_;  // signalled once, by Finish
  bool done_ COHORT_GUARDED_BY(mu_) = false;
  Status status_ COHORT_GUARDED_BY(mu_);
  void Finish(Status s) COHORT_EXCLUDES(mu_);
};

class Communicator {
 public:
  static Result<std::unique_ptr<Communicator>> Create(std::shared_ptr<store::Store> store,
                                                      int rank, int size, CommOptions options);
  // The communicator of the job this process was started into (the worker environment,
  // cohort/base/worker_env.h): all of its ranks, through the job's store (a cohort store
  // or etcd). A program not started by a launcher, or started with WORLD_SIZE=1, gets a
  // communicator of one rank. Never alone by accident: with WORLD_SIZE > 1 and no way to
  // reach the job's store, or a malformed environment, the result is kFailedPrecondition
  // saying what is missing; a store that cannot be reached gives its error (kUnavailable,
  // kDeadlineExceeded, kPermissionDenied for a wrong token). Options left empty take the
  // environment's listen address and flight-recorder directory.
  static Result<std::unique_ptr<Communicator>> FromEnvironment(CommOptions options = {});
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "shm", "tcp" or "shm+tcp": how this communicator reaches its peers.
  std::string topology() const;

  using WorkPtr = std::shared_ptr<Work>;
  // in == out is allowed for every collective (in place).
  WorkPtr AllReduce(const void* in, void* out, size_t count, DataType t, ReduceOp op,
                    Exec exec = Exec::kInline);
  // in: size() blocks of `count`; out: this rank's reduced block of `count`.
  WorkPtr ReduceScatter(const void* in, void* out, size_t count, DataType t, ReduceOp op,
                        Exec exec = Exec::kInline);
  // in: `count`; out: size() blocks of `count`, in rank order.
  WorkPtr AllGather(const void* in, void* out, size_t count, DataType t,
                    Exec exec = Exec::kInline);
  WorkPtr Broadcast(void* buf, size_t count, DataType t, int root, Exec exec = Exec::kInline);
  // out is written on the root only.
  WorkPtr Reduce(const void* in, void* out, size_t count, DataType t, ReduceOp op, int root,
                 Exec exec = Exec::kInline);
  // out (size() blocks) on the root only.
  WorkPtr Gather(const void* in, void* out, size_t count, DataType t, int root,
                 Exec exec = Exec::kInline);
  // in (size() blocks) on the root only.
  WorkPtr Scatter(const void* in, void* out, size_t count, DataType t, int root,
                  Exec exec = Exec::kInline);
  // in and out: size() blocks of `count`; block j of in goes to rank j.
  WorkPtr AllToAll(const void* in, void* out, size_t count, DataType t,
                   Exec exec = Exec::kInline);
  WorkPtr Barrier(Exec exec = Exec::kInline);
  WorkPtr Send(const void* buf, size_t count, DataType t, int peer, int tag = 0,
               Exec exec = Exec::kInline);
  WorkPtr Recv(void* buf, size_t count, DataType t, int peer, int tag = 0,
               Exec exec = Exec::kInline);

  // Fails every pending and future operation with kCancelled and unblocks waits.
  void Abort();
  // Live reconfiguration, from any thread (a membership watcher): fails every pending and
  // future operation with kAborted "membership changed: <why>" and closes the transports,
  // so an operation blocked on a peer that went away returns at once. The owner then calls
  // Reform. Called while a Reform is forming the new group, it applies to that group once
  // formed (a newer membership arrived meanwhile).
  void Interrupt(std::string_view why);

  // Live reconfiguration: re-forms this communicator over a new membership without a new
  // process. Every operation still pending fails with kAborted ("membership changed"),
  // distinct from a failure; the old connections and shared memory are closed; then the
  // group is formed again as rank `rank` of `size` through `store`, which must hold only
  // the new membership's keys (a new round's prefix: every member, survivors and newcomers
  // alike, calls Reform or Create there). Operations issued afterwards run in the new
  // group. Must not race with Issue: the owner calls it between operations. On an error
  // (the new group did not form by `deadline`, or `store` was aborted) every later
  // operation fails with it.
  Status Reform(std::shared_ptr<store::Store> store, int rank, int size, Deadline deadline);
  std::string FlightRecorderDump() const;

 private:
  class Impl;
  explicit Communicator(std::unique_ptr<Impl> impl, int rank, int size);
  // impl_ is replaced only by Reform, on the owner's thread, under impl_mu_; the owner reads
  // it without the lock, other threads (Interrupt, Abort) only under it.
  Mutex impl_mu_;
  std::unique_ptr<Impl> impl_;
  bool forming_ COHORT_GUARDED_BY(impl_mu_) = false;
  std::optional<Status> pending_interrupt_ COHORT_GUARDED_BY(impl_mu_);
  int rank_, size_;
};

}  // namespace cohort::comm
