// Implements MemoryStore. Thread-safe: mu_ guards state_, written_ and aborted_.
#include "cohort/store/memory_store.h"

#include <fmt/ranges.h>

namespace cohort::store {

Status WaitTimeout(const std::vector<std::string>& keys) {
  return DeadlineExceeded("timed out waiting for key(s) {}", fmt::join(keys, ", "));
}

Status MemoryStore::WaitLocked(const std::vector<std::string>& keys, Deadline deadline) {
  for (;;) {
    if (aborted_) return Cancelled("store aborted");
    if (state_.ContainsAll(keys)) return Status::Ok();
    if (!changed_.WaitUntil(&mu_, deadline)) {
      if (aborted_) return Cancelled("store aborted");
      if (state_.ContainsAll(keys)) return Status::Ok();
      return WaitTimeout(keys);
    }
  }
}

Status MemoryStore::Set(std::string_view key, std::string_view value, Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  state_.Set(key, value);
  Written(key);
  changed_.SignalAll();
  return Status::Ok();
}

Result<std::string> MemoryStore::Get(std::string_view key, Deadline deadline) {
  MutexLock lock(&mu_);
  std::vector<std::string> keys{std::string(key)};
  COHORT_RETURN_IF_ERROR(WaitLocked(keys, deadline));
  return *state_.Find(key);
}

Result<int64_t> MemoryStore::Add(std::string_view key, int64_t delta, Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  auto result = state_.Add(key, delta);
  if (result.ok()) Written(key);
  changed_.SignalAll();
  return result;
}

Result<std::string> MemoryStore::CompareSet(std::string_view key, std::string_view expected,
                                            std::string_view desired, Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  std::string result = state_.CompareSet(key, expected, desired);
  if (result == desired) Written(key);
  changed_.SignalAll();
  return result;
}

Result<bool> MemoryStore::CreateAll(const std::vector<std::string>& keys,
                                     const std::vector<std::string>& values, Deadline) {
  if (keys.size() != values.size()) {
    return InvalidArgument("{} keys but {} values to create", keys.size(), values.size());
  }
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  const KvState::Created created = state_.CreateAll(keys, values);
  if (created == KvState::Created::kWritten) {
    for (const auto& k : keys) Written(k);
    changed_.SignalAll();
  }
  return created != KvState::Created::kRefused;
}

Status MemoryStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  MutexLock lock(&mu_);
  return WaitLocked(keys, deadline);
}

Result<bool> MemoryStore::Check(const std::vector<std::string>& keys, Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  return state_.ContainsAll(keys);
}

Result<std::vector<std::optional<std::string>>> MemoryStore::Peek(
    const std::vector<std::string>& keys, Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  return state_.Peek(keys);
}

Result<bool> MemoryStore::Delete(std::string_view key, Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  written_.erase(std::string(key));
  return state_.Delete(key);
}

Result<int64_t> MemoryStore::NumKeys(Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  return state_.size();
}

Result<std::vector<std::string>> MemoryStore::MultiGet(const std::vector<std::string>& keys,
                                                       Deadline deadline) {
  MutexLock lock(&mu_);
  COHORT_RETURN_IF_ERROR(WaitLocked(keys, deadline));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(*state_.Find(k));
  return values;
}

Status MemoryStore::MultiSet(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values, Deadline) {
  if (keys.size() != values.size()) {
    return InvalidArgument("MultiSet with {} keys and {} values", keys.size(), values.size());
  }
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  for (size_t i = 0; i < keys.size(); ++i) {
    state_.Set(keys[i], values[i]);
    Written(keys[i]);
  }
  changed_.SignalAll();
  return Status::Ok();
}

void MemoryStore::Written(std::string_view key) {
  written_.insert_or_assign(std::string(key), SteadyClock::now());
}

Result<std::vector<bool>> MemoryStore::Silent(const std::vector<std::string>& keys,
                                              Duration quiet_for, Deadline) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  const auto now = SteadyClock::now();
  std::vector<bool> silent;
  silent.reserve(keys.size());
  for (const auto& k : keys) {
    auto it = written_.find(k);
    silent.push_back(it == written_.end() || now - it->second >= quiet_for);
  }
  return silent;
}

void MemoryStore::Abort() {
  MutexLock lock(&mu_);
  aborted_ = true;
  changed_.SignalAll();
}

}  // namespace cohort::store
