// Implements KvState. Not thread-safe by itself (see kv_state.h).
#include "cohort/store/kv_state.h"

#include "cohort/base/strings.h"

namespace cohort::store {

Result<int64_t> KvState::Add(std::string_view key, int64_t delta) {
  auto it = map_.find(std::string(key));
  int64_t current = 0;
  if (it != map_.end()) {
    auto parsed = ParseInt64(it->second);
    if (!parsed) {
      return InvalidArgument("Add on key '{}' whose value is not an integer", key);
    }
    current = *parsed;
  }
  int64_t next;
  if (__builtin_add_overflow(current, delta, &next)) {
    return InvalidArgument("Add of {} to key '{}' ({}) leaves the int64 range", delta, key,
                           current);
  }
  map_.insert_or_assign(std::string(key), std::to_string(next));
  return next;
}

std::string KvState::CompareSet(std::string_view key, std::string_view expected,
                                std::string_view desired) {
  auto it = map_.find(std::string(key));
  if (it == map_.end()) {
    if (expected.empty()) {
      map_.emplace(std::string(key), std::string(desired));
      return std::string(desired);
    }
    return std::string();
  }
  if (it->second == expected) it->second = std::string(desired);
  return it->second;
}

KvState::Created KvState::CreateAll(const std::vector<std::string>& keys,
                                    const std::vector<std::string>& values) {
  bool none = true, own = true;
  for (size_t i = 0; i < keys.size() && i < values.size(); ++i) {
    const std::string* v = Find(keys[i]);
    none = none && v == nullptr;
    own = own && v != nullptr && *v == values[i];
  }
  if (!none) return own ? Created::kHeld : Created::kRefused;
  for (size_t i = 0; i < keys.size() && i < values.size(); ++i) Set(keys[i], values[i]);
  return Created::kWritten;
}

}  // namespace cohort::store
