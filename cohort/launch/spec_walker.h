// SpecWalker: reads fields of a YAML spec (job specs, pipeline specs) while collecting every
// problem with the path of its field, so one pass reports them all. Also the checks such
// specs share: "did you mean" suggestions and environment variable names.
//
// Thread-safety: a walker is used by one thread; the free functions are pure.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/launch/job_spec.h"

namespace cohort::launch {

// The entry of `known` closest to `name` (a likely typo), or "" when none is close.
std::string ClosestName(const std::string& name, const std::vector<std::string>& known);

// [A-Za-z_][A-Za-z0-9_]*
bool IsEnvName(std::string_view name);

// RFC 1123 label: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters (Kubernetes object
// and volume names, job names).
bool IsDnsLabel(std::string_view s);
// RFC 1123 subdomain: labels joined by '.', at most 253 characters.
bool IsDnsSubdomain(std::string_view s);

class SpecWalker {
 public:
  explicit SpecWalker(std::vector<Problem>* problems) : problems_(problems) {}

  void Add(const std::string& where, std::string what) {
    problems_->push_back({where, std::move(what)});
  }
  // Reports keys of `map` that are not in `known`, suggesting the closest known key.
  void CheckKeys(const YAML::Node& map, const std::string& path,
                 const std::vector<std::string>& known);
  // A scalar field; absent (or null) gives nullopt, a list or map a problem.
  std::optional<std::string> String(const YAML::Node& map, const std::string& path,
                                    const std::string& key);
  // A whole number in [min, max].
  std::optional<int64_t> Int(const YAML::Node& map, const std::string& path,
                             const std::string& key, int64_t min, int64_t max);
  // A list of scalars; absent gives an empty list.
  std::vector<std::string> StringList(const YAML::Node& map, const std::string& path,
                                      const std::string& key);

  // "path.key", or "key" at the root.
  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

 private:
  std::vector<Problem>* problems_;
};

}  // namespace cohort::launch
