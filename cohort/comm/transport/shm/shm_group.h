// ShmGroup: the ranks of one host sharing a memory segment, and the synchronization the
// shared-memory collectives are built from.
//
// Segment: a header, one control block per member (cache-line separated counters, the
// member's current OpDesc and pid), then two slot buffers per member of slot_bytes each.
// A member writes only its own slots and control block; everyone reads everyone's.
//
// Synchronization (all counters are 32-bit and compared with wrap-around):
//   arrive  bumped by Arrive() after the member wrote its slot for this step
//   depart  bumped by Depart() after the member finished reading others' slots for a chunk
// A member may overwrite its slot buffer b = chunk % 2 only after every member departed
// from chunk - 2 (BeginChunk waits for that). Waits spin briefly, then sleep on a futex
// that publishers wake only when someone sleeps; every wait honours the deadline, the
// group's abort flag, and notices a dead peer (its pid is gone).
//
// Setup steps (Create): 1. member 0 creates the segment (shm_open O_EXCL), sizes and
// initializes it, publishes its name in the store; 2. the others map it and report;
// 3. member 0 unlinks the name once all have mapped it, so no crash leaks it (and on every
// way out of a formation that fails; a member SIGKILLed before that leaves the name to the
// job's sweeper). The others map only a segment of cohort's name form that is this user's,
// private and of the group's size.
//
// Thread-safety: one owner thread per member (the communicator's runner); Abort() from any
// thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/comm/op.h"
#include "cohort/store/store.h"

namespace cohort::comm {

class ShmGroup {
 public:
  // `ranks` are the global ranks of the members, in member order; `index` is ours.
  // `job_cookie` (hex; the part before a '.'): the segment is named
  // /cohort-<cookie>-<16 hex>, which the job's sweeper removes should a member be killed
  // before step 3 (JobSweeper::RemoveSegments); without one, /cohort-<16 hex>.
  static Result<std::unique_ptr<ShmGroup>> Create(store::Store& store, const std::string& prefix,
                                                  std::vector<int> ranks, int index,
                                                  size_t slot_bytes, Deadline deadline,
                                                  const std::string& job_cookie = "");
  ~ShmGroup();

  int index() const { return index_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  int global_rank(int member) const { return ranks_[member]; }
  size_t slot_bytes() const { return slot_bytes_; }
  char* slot(int member, int buffer) const;

  // Waits until this member may write its slot for the next chunk; returns the buffer index.
  Result<int> BeginChunk(const OpDesc& desc, Deadline deadline);
  // Publishes that this member's slot holds its data for the current step.
  void Arrive(const OpDesc& desc);
  // Waits for every member's (or one member's) latest Arrive and checks their OpDesc.
  Status WaitArrivals(const OpDesc& desc, Deadline deadline);
  Status WaitArrival(int member, const OpDesc& desc, Deadline deadline);
  // Publishes that this member is done reading other slots for the current chunk.
  void Depart();

  // Point-to-point: a byte stream per ordered pair of members through a ring in the
  // segment (single producer, single consumer), carrying the OpDesc header first so a
  // mismatched send/recv is reported like a mismatched collective.
  Status Send(int to, const void* buf, size_t bytes, const OpDesc& desc, Deadline deadline);
  Status Recv(int from, void* buf, size_t bytes, const OpDesc& desc, Deadline deadline);

  void Abort();

 private:
  struct Control;
  struct PairControl;
  PairControl& pair(int from, int to) const;
  char* ring(int from, int to) const;
  // Waits until done(word) holds; `peer` is the member expected to change `word`.
  // (Defined in shm_group.cc, its only user; a template so the check inlines into the spin.)
  template <typename Done>
  Status WaitUntil(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
                   const Done& done, int peer, const OpDesc& desc, Deadline deadline,
                   const char* what);
  Status Push(int to, const char* data, size_t bytes, const OpDesc& desc, Deadline deadline);
  Status Pull(int from, char* data, size_t bytes, const OpDesc& desc, Deadline deadline);
  ShmGroup(std::vector<int> ranks, int index, size_t slot_bytes)
      : ranks_(std::move(ranks)), index_(index), slot_bytes_(slot_bytes) {}
  Control& control(int member) const;
  Status WaitCounter(int member, bool arrive, uint32_t target, const OpDesc& desc,
                     Deadline deadline);
  void Publish(std::atomic<uint32_t>& counter, uint32_t value);

  std::vector<int> ranks_;
  int index_;
  size_t slot_bytes_;
  char* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  size_t control_offset_ = 0;
  size_t data_offset_ = 0;
  size_t pairs_offset_ = 0;
  uint32_t arrivals_ = 0;  // our arrive counter (owner thread)
  uint32_t chunks_ = 0;    // our depart counter
  int spin_pauses_ = 2000;  // busy-wait budget before sleeping (smaller when oversubscribed)
  int spin_yields_ = 2000;
};

}  // namespace cohort::comm
