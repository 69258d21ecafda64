// JsonToYaml: a JSON value written as block YAML for tools that read YAML 1.1 (kubectl,
// Argo): a string stays a plain scalar only when no reader could take it for anything else
// (a letter, '/' or '_' first; letters, digits and _ . / - = @ : after it; not a YAML 1.1
// boolean or null such as "on" or "no"; no trailing ':'); everything else is
// double-quoted. Empty maps and lists are written {} and []. Keys keep the object's order.
// Used for Kubernetes manifests and Argo workflows.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cohort/base/status.h"

namespace cohort::launch {

Result<std::string> JsonToYaml(const nlohmann::ordered_json& value);
Result<std::string> JsonToYaml(const nlohmann::json& value);

}  // namespace cohort::launch
