// FlightRecorder: the last N operations of one rank (sequence, kind, type, count, state,
// times), for post-mortems of hangs and failures. Dumped on timeout, on abort, and when the
// process receives SIGUSR1 (the agent forwards SIGUSR1 to every worker).
//
// Thread-safety: Record/Update from the communicator's runner, Dump from any thread; a mutex
// guards the ring. The SIGUSR1 path goes through a self-pipe to a dumper thread, so the
// signal handler itself only write(2)s.
#pragma once

#include <string>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/comm/op.h"

namespace cohort::comm {

enum class OpState : uint8_t { kIssued, kStarted, kCompleted, kFailed };

class FlightRecorder {
 public:
  // `dump_dir`: where DumpNow also writes rank<R>.txt (empty: stderr only).
  FlightRecorder(int rank, size_t capacity, std::string dump_dir = "");
  ~FlightRecorder();

  // Returns the entry's slot id for Update.
  size_t Record(const OpDesc& desc);
  void Update(size_t id, uint32_t seq, OpState state, const std::string& error = "");
  // Human-readable table, oldest first.
  std::string Dump() const;
  // Writes Dump() to stderr (and to <dump_dir>/rank<R>.txt when a directory was given).
  void DumpNow(const std::string& reason) const;

 private:
  struct Entry {
    OpDesc desc;
    OpState state = OpState::kIssued;
    double issued = 0, started = 0, ended = 0;  // wall seconds
    std::string error;
  };
  const int rank_;
  const std::string dump_dir_;
  mutable Mutex mu_;
  std::vector<Entry> ring_ COHORT_GUARDED_BY(mu_);
  size_t next_ COHORT_GUARDED_BY(mu_) = 0;
  size_t used_ COHORT_GUARDED_BY(mu_) = 0;
};

}  // namespace cohort::comm
