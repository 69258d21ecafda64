// JsonToYaml with yaml-cpp (see yaml_emit.h). Thread-safety: pure functions.
#include "cohort/launch/yaml_emit.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <set>

#include "cohort/base/strings.h"

namespace cohort::launch {
namespace {

bool IsPlainSafe(const std::string& s) {
  if (s.empty() || s.back() == ':') return false;
  const char first = s[0];
  if (!(std::isalpha(static_cast<unsigned char>(first)) || first == '/' || first == '_')) {
    return false;
  }
  for (char ch : s) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '/' ||
          ch == '-' || ch == '=' || ch == '@' || ch == ':')) {
      return false;
    }
  }
  // Words YAML 1.1 readers take for booleans or null.
  static const std::set<std::string> kReserved = {"y",   "n",    "yes",   "no",  "on",
                                                  "off", "true", "false", "null"};
  return kReserved.count(ToLower(s)) == 0;
}

void EmitString(YAML::Emitter& out, const std::string& s) {
  if (IsPlainSafe(s)) {
    out << s;
  } else {
    out << YAML::DoubleQuoted << s;
  }
}

template <typename Json>
void Emit(YAML::Emitter& out, const Json& j) {
  switch (j.type()) {
    case Json::value_t::object:
      if (j.empty()) {
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        break;
      }
      out << YAML::BeginMap;
      for (const auto& [k, v] : j.items()) {
        out << YAML::Key;
        EmitString(out, k);
        out << YAML::Value;
        Emit(out, v);
      }
      out << YAML::EndMap;
      break;
    case Json::value_t::array:
      if (j.empty()) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        break;
      }
      out << YAML::BeginSeq;
      for (const auto& v : j) Emit(out, v);
      out << YAML::EndSeq;
      break;
    case Json::value_t::string:
      EmitString(out, j.template get<std::string>());
      break;
    case Json::value_t::boolean:
      out << (j.template get<bool>() ? "true" : "false");
      break;
    case Json::value_t::number_integer:
      out << j.template get<int64_t>();
      break;
    case Json::value_t::number_unsigned:
      out << j.template get<uint64_t>();
      break;
    case Json::value_t::number_float:
      out << j.template get<double>();
      break;
    default:
      out << YAML::Null;
      break;
  }
}

template <typename Json>
Result<std::string> ToYaml(const Json& value) {
  YAML::Emitter out;
  out.SetIndent(2);
  Emit(out, value);
  if (!out.good()) return Internal("YAML emitter: {}", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace

Result<std::string> JsonToYaml(const nlohmann::ordered_json& value) { return ToYaml(value); }
Result<std::string> JsonToYaml(const nlohmann::json& value) { return ToYaml(value); }

}  // namespace cohort::launch
