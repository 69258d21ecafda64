// Reading JSON that came from another process (an agent's /api/state, /api/job) without
// trusting its shape: a missing field, or one of another type, reads as absent (null, "",
// 0, an empty array, or the given default); nothing here throws. Thread-safety: pure
// functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace cohort::metrics::json_read {

inline const nlohmann::json& At(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  return j.is_object() && j.contains(key) ? j[key] : kNull;
}
inline const nlohmann::json& Arr(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kEmpty = nlohmann::json::array();
  const nlohmann::json& v = At(j, key);
  return v.is_array() ? v : kEmpty;
}
inline std::string Str(const nlohmann::json& j, const char* key,
                       const std::string& otherwise = "") {
  const nlohmann::json& v = At(j, key);
  return v.is_string() ? v.get<std::string>() : otherwise;
}
inline double Dbl(const nlohmann::json& j, const char* key, double otherwise = 0) {
  const nlohmann::json& v = At(j, key);
  return v.is_number() ? v.get<double>() : otherwise;
}
inline int Int(const nlohmann::json& j, const char* key, int otherwise = 0) {
  const nlohmann::json& v = At(j, key);
  return v.is_number_integer() ? v.get<int>() : otherwise;
}

}  // namespace cohort::metrics::json_read
