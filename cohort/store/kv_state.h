// KvState: the key-value state machine shared by MemoryStore, FileStore and StoreServer, so
// that every store applies Set/Add/CompareSet/Delete with exactly the same semantics.
//
// Thread-safety: none; the owner serializes access (a mutex, a file lock or the server's
// event-loop thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::store {

class KvState {
 public:
  void Set(std::string_view key, std::string_view value) {
    map_.insert_or_assign(std::string(key), std::string(value));
  }
  const std::string* Find(std::string_view key) const {
    auto it = map_.find(std::string(key));
    return it == map_.end() ? nullptr : &it->second;
  }
  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) const {
    std::vector<std::optional<std::string>> out;
    out.reserve(keys.size());
    for (const auto& k : keys) {
      const std::string* v = Find(k);
      out.push_back(v ? std::optional<std::string>(*v) : std::nullopt);
    }
    return out;
  }
  bool ContainsAll(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (!map_.count(k)) return false;
    }
    return true;
  }
  // Adds `delta` to the decimal value of `key` (missing = 0); fails when the value is not
  // an integer.
  Result<int64_t> Add(std::string_view key, int64_t delta);
  // Store::CreateAll in one step: writes every key when none exists (kWritten); kHeld when
  // every key already holds its value (a request sent again: nothing to write); else
  // kRefused, nothing written. Store::CreateAll's answer is `!= kRefused`.
  enum class Created { kWritten, kHeld, kRefused };
  Created CreateAll(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  // Returns the value after the operation (see Store::CompareSet).
  std::string CompareSet(std::string_view key, std::string_view expected,
                         std::string_view desired);
  bool Delete(std::string_view key) { return map_.erase(std::string(key)) > 0; }
  int64_t size() const { return static_cast<int64_t>(map_.size()); }
  void Clear() { map_.clear(); }

 private:
  std::unordered_map<std::string, std::string> map_;
};

}  // namespace cohort::store
