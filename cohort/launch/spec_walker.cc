// SpecWalker and the shared spec checks (see spec_walker.h). Thread-safety: as there.
#include "cohort/launch/spec_walker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "cohort/base/strings.h"

namespace cohort::launch {
namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string JoinNames(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

}  // namespace

std::string ClosestName(const std::string& name, const std::vector<std::string>& known) {
  std::string best_name;
  size_t best = 3;
  for (const auto& k : known) {
    size_t d = EditDistance(name, k);
    if (d < best && d < std::max<size_t>(k.size(), 2)) {
      best = d;
      best_name = k;
    }
  }
  return best_name;
}

bool IsDnsLabel(std::string_view s) {
  auto lower_alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (s.empty() || s.size() > 63) return false;
  if (!lower_alnum(s.front()) || !lower_alnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return lower_alnum(c) || c == '-'; });
}

bool IsDnsSubdomain(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (const auto& part : Split(s, '.', false)) {
    if (!IsDnsLabel(part)) return false;
  }
  return true;
}

bool IsEnvName(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

void SpecWalker::CheckKeys(const YAML::Node& map, const std::string& path,
                           const std::vector<std::string>& known) {
  for (const auto& kv : map) {
    std::string key = kv.first.Scalar();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string hint = ClosestName(key, known);
    Add(Join(path, key), hint.empty()
                             ? fmt::format("unknown field (known: {})", JoinNames(known))
                             : fmt::format("unknown field (did you mean '{}'?)", hint));
  }
}

std::optional<std::string> SpecWalker::String(const YAML::Node& map, const std::string& path,
                                              const std::string& key) {
  YAML::Node n = map[key];
  if (!n || n.IsNull()) return std::nullopt;
  if (!n.IsScalar()) {
    Add(Join(path, key), "must be a single value, not a list or a map");
    return std::nullopt;
  }
  return n.Scalar();
}

std::optional<int64_t> SpecWalker::Int(const YAML::Node& map, const std::string& path,
                                       const std::string& key, int64_t min, int64_t max) {
  auto s = String(map, path, key);
  if (!s) return std::nullopt;
  auto v = ParseInt64(*s);
  if (!v) {
    Add(Join(path, key), fmt::format("'{}' is not a whole number", *s));
    return std::nullopt;
  }
  if (*v < min || *v > max) {
    Add(Join(path, key), fmt::format("{} is out of range ({}..{})", *v, min, max));
    return std::nullopt;
  }
  return *v;
}

std::vector<std::string> SpecWalker::StringList(const YAML::Node& map, const std::string& path,
                                                const std::string& key) {
  std::vector<std::string> out;
  YAML::Node n = map[key];
  if (!n || n.IsNull()) return out;
  if (!n.IsSequence()) {
    Add(Join(path, key), "must be a list (write [a, b] or one '- item' per line)");
    return out;
  }
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i].IsScalar()) {
      Add(fmt::format("{}[{}]", Join(path, key), i), "must be a single value");
      continue;
    }
    out.push_back(n[i].Scalar());
  }
  return out;
}

}  // namespace cohort::launch
