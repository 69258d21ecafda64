// ParseJsonBounded (see json_bounded.h). Thread-safety: pure functions.
#include "cohort/base/json_bounded.h"

namespace cohort {

bool JsonDepthWithin(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

nlohmann::json ParseJsonBounded(std::string_view text, size_t max_bytes, int max_depth) {
  if (text.size() > max_bytes || !JsonDepthWithin(text, max_depth)) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace cohort
