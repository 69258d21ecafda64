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
  Status Set(std::string_view key, std::string_view value, Deadline deadline) override;
  Result<std::string> Get(std::string_view key, Deadline deadline) override;
  Result<int64_t> Add(std::string_view key, int64_t delta, Deadline deadline) override;
  Result<std::string> CompareSet(std::string_view key, std::string_view expected,
                                 std::string_view desired, Deadline deadline) override;
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override;
  Result<bool> Check(const std::vector<std::string>& keys, Deadline deadline) override;
  Result<std::vector<std::optional<std::string>>> Peek(const std::vector<std::string>& keys,
                                                       Deadline deadline) override;
  Result<bool> Delete(std::string_view key, Deadline deadline) override;
  Result<int64_t> NumKeys(Deadline deadline) override;
  Result<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                            Deadline deadline) override;
  Status MultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                  Deadline deadline) override;
  void Abort() override;

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
