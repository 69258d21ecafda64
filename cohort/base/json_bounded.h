// Parsing JSON that another process or machine wrote (an agent's /api/job answer, a
// rendezvous record, a channel message, a checkpoint's metadata) within limits: nesting
// deeper than `max_depth` or text longer than `max_bytes` is refused before nlohmann parses
// it, so a hostile answer ("[[[[..." 100,000 deep) cannot exhaust the stack of whoever
// parses, copies, prints or destroys it. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cohort {

inline constexpr int kJsonMaxDepth = 64;

// Whether `text` nests arrays and objects at most `max_depth` deep (strings are skipped,
// escapes included). Linear in the text; does not validate anything else.
bool JsonDepthWithin(std::string_view text, int max_depth);

// The parsed value, or a discarded one (is_discarded()) when the text is malformed, longer
// than `max_bytes`, or nested deeper than `max_depth`. Never throws.
nlohmann::json ParseJsonBounded(std::string_view text, size_t max_bytes,
                                int max_depth = kJsonMaxDepth);

}  // namespace cohort
