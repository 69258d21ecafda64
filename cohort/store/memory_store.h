// MemoryStore: an in-process Store for tests and for threads of one process. Blocking
// calls wait on a condition variable that writers notify.
//
// Thread-safety: all methods are safe from any thread (one mutex guards the state).
#pragma once

#include <unordered_map>

#include "cohort/base/mutex.h"
#include "cohort/store/kv_state.h"
#include "cohort/store/store.h"

namespace cohort::store {

class MemoryStore final : public Store {
 public:
  COHORT_STORE_METHODS(override);  // the Store interface (store.h)
  // Dated by this store's clock: when each key was last written.
  Result<std::vector<bool>> Silent(const std::vector<std::string>& keys, Duration quiet_for,
                                   Deadline deadline) override;
  // In one step (KvState::CreateAll).
  Result<bool> CreateAll(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values, Deadline deadline) override;

 private:
  // Waits until every key exists; kCancelled after Abort().
  Status WaitLocked(const std::vector<std::string>& keys, Deadline deadline)
      COHORT_REQUIRES(mu_);

  Mutex mu_;
  CondVar changed_;  // signalled on every write and on Abort
  // Records that `key` was written now (Silent).
  void Written(std::string_view key) COHORT_REQUIRES(mu_);

  KvState state_ COHORT_GUARDED_BY(mu_);
  std::unordered_map<std::string, SteadyClock::time_point> written_ COHORT_GUARDED_BY(mu_);
  bool aborted_ COHORT_GUARDED_BY(mu_) = false;
};

// Shared by stores: the error a wait returns when its deadline passes.
Status WaitTimeout(const std::vector<std::string>& keys);

}  // namespace cohort::store
