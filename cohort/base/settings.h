// Typed settings read from the environment: one declaration per setting, parsed once.
//
//   inline const Setting<int64_t> kStoreMaxFrame{"COHORT_STORE_MAX_FRAME", 64 << 20,
//                                                "largest store frame in bytes"};
//   int64_t max = kStoreMaxFrame.Get();
//
// A malformed value is reported once (warning) and the default is used.
// Thread-safety: Get() is safe from any thread (the value is computed once).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "cohort/base/log.h"

namespace cohort {

std::optional<int64_t> ParseInt64(std::string_view text);
std::optional<double> ParseDouble(std::string_view text);
std::optional<bool> ParseBool(std::string_view text);

template <typename T>
class Setting {
 public:
  Setting(const char* name, T default_value, const char* help)
      : name_(name), default_(std::move(default_value)), help_(help) {}

  const char* name() const { return name_; }
  const char* help() const { return help_; }
  const T& Get() const {
    std::call_once(once_, [this] { value_ = Read(); });
    return value_;
  }

 private:
  T Read() const {
    const char* raw = std::getenv(name_);
    if (raw == nullptr || *raw == '\0') return default_;
    std::optional<T> parsed;
    if constexpr (std::is_same_v<T, std::string>) {
      parsed = std::string(raw);
    } else if constexpr (std::is_same_v<T, bool>) {
      parsed = ParseBool(raw);
    } else if constexpr (std::is_integral_v<T>) {
      auto v = ParseInt64(raw);
      if (v) parsed = static_cast<T>(*v);
    } else {
      parsed = ParseDouble(raw);
    }
    if (!parsed) {
      COHORT_LOG_WARN("settings", "ignoring {}={:?}: not a valid value; using the default", name_,
                      raw);
      return default_;
    }
    return *parsed;
  }

  const char* name_;
  T default_;
  const char* help_;
  mutable std::once_flag once_;
  mutable T value_{};
};

}  // namespace cohort
