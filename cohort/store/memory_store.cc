// Implements MemoryStore. Thread-safe: mu_ guards state_ and aborted_.
#include "cohort/store/memory_store.h"

#include <fmt/ranges.h>

namespace cohort::store {

Status WaitTimeout(const std::vector<std::string>& keys) {
  return DeadlineExceeded("timed out waiting for key(s) {}", fmt::join(keys, ", "));
}

Status MemoryStore::WaitLocked(std::unique_lock<std::mutex>& lock,
                               const std::vector<std::string>& keys, Deadline deadline) {
  for (;;) {
    if (aborted_) return Cancelled("store aborted");
    if (state_.ContainsAll(keys)) return Status::Ok();
    if (deadline.infinite()) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, deadline.time()) == std::cv_status::timeout) {
      if (aborted_) return Cancelled("store aborted");
      if (state_.ContainsAll(keys)) return Status::Ok();
      return WaitTimeout(keys);
    }
  }
}

Status MemoryStore::Set(std::string_view key, std::string_view value, Deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  state_.Set(key, value);
  changed_.notify_all();
  return Status::Ok();
}

Result<std::string> MemoryStore::Get(std::string_view key, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::string> keys{std::string(key)};
  COHORT_RETURN_IF_ERROR(WaitLocked(lock, keys, deadline));
  return *state_.Find(key);
}

Result<int64_t> MemoryStore::Add(std::string_view key, int64_t delta, Deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  auto result = state_.Add(key, delta);
  changed_.notify_all();
  return result;
}

Result<std::string> MemoryStore::CompareSet(std::string_view key, std::string_view expected,
                                            std::string_view desired, Deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  std::string result = state_.CompareSet(key, expected, desired);
  changed_.notify_all();
  return result;
}

Status MemoryStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return WaitLocked(lock, keys, deadline);
}

Result<bool> MemoryStore::Check(const std::vector<std::string>& keys, Deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  return state_.ContainsAll(keys);
}

Result<std::vector<std::optional<std::string>>> MemoryStore::Peek(
    const std::vector<std::string>& keys, Deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  return state_.Peek(keys);
}

Result<bool> MemoryStore::Delete(std::string_view key, Deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  return state_.Delete(key);
}

Result<int64_t> MemoryStore::NumKeys(Deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  return state_.size();
}

Result<std::vector<std::string>> MemoryStore::MultiGet(const std::vector<std::string>& keys,
                                                       Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  COHORT_RETURN_IF_ERROR(WaitLocked(lock, keys, deadline));
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
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return Cancelled("store aborted");
  for (size_t i = 0; i < keys.size(); ++i) state_.Set(keys[i], values[i]);
  changed_.notify_all();
  return Status::Ok();
}

void MemoryStore::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  changed_.notify_all();
}

}  // namespace cohort::store
