// MemoryStore: an in-process Store for tests and for threads of one process. Blocking
// calls wait on a condition variable that writers notify.
//
// Thread-safety: all methods are safe from any thread (one mutex guards the state).
#pragma once

#include <condition_variable>
#include <mutex>

#include "cohort/store/kv_state.h"
#include "cohort/store/store.h"

namespace cohort::store {

class MemoryStore final : public Store {
 public:
  COHORT_STORE_METHODS(override);  // the Store interface (store.h)

 private:
  // Waits (mu_ held) until every key exists; kCancelled after Abort().
  Status WaitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                    Deadline deadline);

  std::mutex mu_;
  std::condition_variable changed_;
  KvState state_;
  bool aborted_ = false;
};

// Shared by stores: the error a wait returns when its deadline passes.
Status WaitTimeout(const std::vector<std::string>& keys);

}  // namespace cohort::store
