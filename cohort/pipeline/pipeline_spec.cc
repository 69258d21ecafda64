// PipelineSpec parsing and validation (see pipeline_spec.h). Thread-safety: pure functions.
#include "cohort/pipeline/pipeline_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <set>

#include "cohort/base/file.h"
#include "cohort/base/strings.h"
#include "cohort/launch/spec_walker.h"

namespace cohort::pipeline {
namespace {

namespace fs = std::filesystem;

using launch::ClosestName;
using launch::IsEnvName;
using Walker = launch::SpecWalker;

std::string Hint(const std::string& name, const std::vector<std::string>& known) {
  std::string c = ClosestName(name, known);
  return c.empty() ? "" : fmt::format(" (did you mean '{}'?)", c);
}

std::string JoinNames(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

bool IsStepName(const std::string& s) {
  static const std::regex re("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return s.size() <= 63 && std::regex_match(s, re);
}
bool IsIdentifier(const std::string& s) {
  static const std::regex re("[A-Za-z_][A-Za-z0-9_-]*");
  return std::regex_match(s, re);
}

// Why `text` is not a value of `type`, or "".
std::string TypeError(ParamType type, const std::string& text) {
  switch (type) {
    case ParamType::kString: return "";
    case ParamType::kInt:
      return ParseInt64(text) ? "" : fmt::format("'{}' is not an int", text);
    case ParamType::kFloat:
      return ParseDouble(text) ? "" : fmt::format("'{}' is not a float", text);
    case ParamType::kBool:
      return text == "true" || text == "false"
                 ? ""
                 : fmt::format("'{}' is not a bool (true or false)", text);
  }
  return "";
}

void ParseParameters(Walker& w, const YAML::Node& n, PipelineSpec* spec) {
  if (!n.IsMap()) {
    w.Add("parameters", "must be a map of NAME: {type, default, enum}");
    return;
  }
  for (const auto& kv : n) {
    Parameter p;
    p.name = kv.first.Scalar();
    const std::string path = "parameters." + p.name;
    if (!IsIdentifier(p.name)) {
      w.Add(path, "a parameter name is letters, digits, '_' and '-', starting with a letter");
    }
    const YAML::Node& v = kv.second;
    if (v.IsScalar()) {  // shorthand: NAME: default (a string)
      p.has_default = true;
      p.default_value = v.Scalar();
      spec->parameters.push_back(p);
      continue;
    }
    if (!v.IsMap()) {
      w.Add(path, "must be a map {type, default, enum} or a default value");
      continue;
    }
    w.CheckKeys(v, path, {"type", "default", "enum", "description"});
    std::string type = w.String(v, path, "type").value_or("string");
    if (type == "string") {
      p.type = ParamType::kString;
    } else if (type == "int" || type == "integer") {
      p.type = ParamType::kInt;
    } else if (type == "float" || type == "number") {
      p.type = ParamType::kFloat;
    } else if (type == "bool" || type == "boolean") {
      p.type = ParamType::kBool;
    } else {
      w.Add(path + ".type",
            fmt::format("'{}' is not a type (string, int, float, bool){}", type,
                        Hint(type, {"string", "int", "float", "bool"})));
    }
    if (auto d = w.String(v, path, "default")) {
      p.has_default = true;
      p.default_value = *d;
      if (std::string e = TypeError(p.type, *d); !e.empty()) {
        w.Add(path + ".default", fmt::format("{} (the parameter's type is {})", e,
                                             ParamTypeName(p.type)));
      }
    }
    p.enum_values = w.StringList(v, path, "enum");
    for (size_t i = 0; i < p.enum_values.size(); ++i) {
      if (std::string e = TypeError(p.type, p.enum_values[i]); !e.empty()) {
        w.Add(fmt::format("{}.enum[{}]", path, i), e);
      }
    }
    if (p.has_default && !p.enum_values.empty() &&
        std::find(p.enum_values.begin(), p.enum_values.end(), p.default_value) ==
            p.enum_values.end()) {
      w.Add(path + ".default", fmt::format("'{}' is not one of {}", p.default_value,
                                           JoinNames(p.enum_values)));
    }
    spec->parameters.push_back(p);
  }
}

// A step's env: map.
void ParseStepEnv(Walker& w, const YAML::Node& n, const std::string& path, Step* s) {
  if (YAML::Node env = n["env"]; env && !env.IsNull()) {
    if (!env.IsMap()) {
      w.Add(path + ".env", "must be a map KEY: value");
    } else {
      for (const auto& kv : env) {
        std::string key = kv.first.Scalar();
        if (!IsEnvName(key)) {
          w.Add(path + ".env." + key, "not a valid environment variable name");
        }
        if (!kv.second.IsScalar()) {
          w.Add(path + ".env." + key, "must be a single value");
          continue;
        }
        s->env[key] = kv.second.Scalar();
      }
    }
  }
}

// A step's outputs: value names and {file: path} entries.
void ParseStepOutputs(Walker& w, const YAML::Node& n, const std::string& path, Step* s) {
  if (YAML::Node outs = n["outputs"]; outs && !outs.IsNull()) {
    if (!outs.IsSequence()) {
      w.Add(path + ".outputs", "must be a list of value names or {file: path}");
    } else {
      std::set<std::string> seen;
      for (size_t i = 0; i < outs.size(); ++i) {
        const std::string opath = fmt::format("{}.outputs[{}]", path, i);
        const YAML::Node& o = outs[i];
        if (o.IsScalar()) {
          if (!IsIdentifier(o.Scalar())) {
            w.Add(opath, fmt::format("'{}' is not a value name (letters, digits, '_', '-'); "
                                     "write {{file: {}}} for a file",
                                     o.Scalar(), o.Scalar()));
          } else if (!seen.insert(o.Scalar()).second) {
            w.Add(opath, fmt::format("'{}' is declared twice", o.Scalar()));
          } else {
            s->output_values.push_back(o.Scalar());
          }
        } else if (o.IsMap() && o["file"] && o["file"].IsScalar() && o.size() == 1) {
          s->output_files.push_back(o["file"].Scalar());
        } else {
          w.Add(opath, "must be a value name or {file: path}");
        }
      }
    }
  }
}

// How a step runs: retries, timeout, cache and its when condition.
void ParseStepPolicy(Walker& w, const YAML::Node& n, const std::string& path, Step* s) {
  if (auto r = w.String(n, path, "retries")) {
    auto v = ParseInt64(*r);
    if (!v || *v < 0 || *v > 100) {
      w.Add(path + ".retries", fmt::format("'{}' is not a number of retries (0..100)", *r));
    } else {
      s->retries = static_cast<int>(*v);
    }
  }
  if (auto t = w.String(n, path, "timeout")) {
    auto v = ParseDouble(*t);
    if (!v || *v <= 0) {
      w.Add(path + ".timeout", fmt::format("'{}' is not a positive number of seconds", *t));
    } else {
      s->timeout_s = *v;
    }
  }
  if (auto c = w.String(n, path, "cache")) {
    if (*c == "true" || *c == "false") {
      s->cache = *c == "true";
    } else {
      w.Add(path + ".cache", fmt::format("'{}' is not true or false", *c));
    }
  }
  if (auto when = w.String(n, path, "when")) {
    s->when = *when;
    auto expr = ParseCondition(*when);
    if (!expr.ok()) {
      w.Add(path + ".when", fmt::format("malformed condition: {}", expr.status().message()));
    } else {
      s->condition = std::shared_ptr<const Expr>(std::move(*expr).release());
    }
  }
}

void ParseStep(Walker& w, const YAML::Node& n, const std::string& path, Step* s) {
  w.CheckKeys(n, path, {"name", "command", "job", "backend", "depends", "env", "workdir",
                        "inputs", "outputs", "retries", "timeout", "cache", "when",
                        "description"});
  s->name = w.String(n, path, "name").value_or("");
  if (s->name.empty()) {
    w.Add(path + ".name", "required");
  } else if (!IsStepName(s->name)) {
    w.Add(path + ".name",
          fmt::format("'{}' must be lowercase letters, digits and '-' (an Argo task name)",
                      s->name));
  }
  if (YAML::Node c = n["command"]; c && !c.IsNull()) {
    if (c.IsScalar()) {
      s->shell = c.Scalar();
      if (Trim(s->shell).empty()) w.Add(path + ".command", "is empty");
    } else {
      s->command = w.StringList(n, path, "command");
      if (s->command.empty()) w.Add(path + ".command", "is an empty list");
    }
  }
  s->job = w.String(n, path, "job").value_or("");
  if (auto b = w.String(n, path, "backend")) {
    s->backend = *b;
    if (s->job.empty()) w.Add(path + ".backend", "only a 'job' step has a backend");
    static const std::vector<std::string> kBackends = {"local", "slurm", "kubernetes", "k8s"};
    if (std::find(kBackends.begin(), kBackends.end(), *b) == kBackends.end()) {
      w.Add(path + ".backend", fmt::format("'{}' is not a backend (local, slurm, kubernetes){}",
                                           *b, Hint(*b, kBackends)));
    }
  }
  bool has_command = !s->command.empty() || !s->shell.empty();
  if (has_command && !s->job.empty()) {
    w.Add(path, "give either 'command' or 'job', not both");
  } else if (!has_command && s->job.empty() && !n["command"]) {
    w.Add(path, "needs a 'command' (argv list or shell string) or a 'job' (job spec path)");
  }
  s->depends = w.StringList(n, path, "depends");
  ParseStepEnv(w, n, path, s);
  s->workdir = w.String(n, path, "workdir").value_or("");
  s->inputs = w.StringList(n, path, "inputs");
  ParseStepOutputs(w, n, path, s);
  ParseStepPolicy(w, n, path, s);
}

// Checks one reference used by step `s` at `where`.
void CheckRef(Walker& w, const PipelineSpec& spec, const Step& s, const Ref& ref,
              const std::string& where) {
  std::vector<std::string> params, steps;
  for (const auto& p : spec.parameters) params.push_back(p.name);
  for (const auto& st : spec.steps) steps.push_back(st.name);
  if (ref.kind == Ref::Kind::kParam) {
    if (!spec.FindParam(ref.param)) {
      w.Add(where, fmt::format("unknown parameter '{}'{}", ref.param, Hint(ref.param, params)));
    }
    return;
  }
  const Step* other = spec.FindStep(ref.step);
  if (!other) {
    w.Add(where, fmt::format("unknown step '{}'{}", ref.step, Hint(ref.step, steps)));
    return;
  }
  if (std::find(other->output_values.begin(), other->output_values.end(), ref.output) ==
      other->output_values.end()) {
    w.Add(where, fmt::format("step '{}' declares no output '{}'{}", ref.step, ref.output,
                             other->output_values.empty()
                                 ? " (it declares no outputs)"
                                 : Hint(ref.output, other->output_values)));
    return;
  }
  if (ref.step == s.name || !DependsOn(spec, s.name, ref.step)) {
    w.Add(where, fmt::format("step '{}' is not a dependency of '{}' (add it to depends)",
                             ref.step, s.name));
  }
}

void CheckTemplates(Walker& w, const PipelineSpec& spec, const Step& s, const std::string& text,
                    const std::string& where) {
  auto uses = FindTemplates(text);
  if (!uses.ok()) {
    w.Add(where, uses.status().message());
    return;
  }
  for (const auto& u : *uses) CheckRef(w, spec, s, u.ref, where);
}

}  // namespace

const char* ParamTypeName(ParamType type) {
  switch (type) {
    case ParamType::kString: return "string";
    case ParamType::kInt: return "int";
    case ParamType::kFloat: return "float";
    case ParamType::kBool: return "bool";
  }
  return "string";
}


const Step* PipelineSpec::FindStep(const std::string& n) const {
  for (const auto& s : steps) {
    if (s.name == n) return &s;
  }
  return nullptr;
}
const Parameter* PipelineSpec::FindParam(const std::string& n) const {
  for (const auto& p : parameters) {
    if (p.name == n) return &p;
  }
  return nullptr;
}

bool DependsOn(const PipelineSpec& spec, const std::string& step, const std::string& ancestor) {
  std::set<std::string> seen;
  std::vector<std::string> todo = {step};
  while (!todo.empty()) {
    std::string cur = todo.back();
    todo.pop_back();
    const Step* s = spec.FindStep(cur);
    if (!s) continue;
    for (const auto& d : s->depends) {
      if (d == ancestor) return true;
      if (seen.insert(d).second) todo.push_back(d);
    }
  }
  return false;
}

std::vector<size_t> TopologicalOrder(const PipelineSpec& spec, std::vector<Problem>* problems) {
  // Kahn's algorithm, always taking the first ready step in spec order.
  const size_t n = spec.steps.size();
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < n; ++i) index.emplace(spec.steps[i].name, i);
  std::vector<int> missing(n, 0);
  std::vector<std::vector<size_t>> dependents(n);
  for (size_t i = 0; i < n; ++i) {
    std::set<size_t> deps;
    for (const auto& d : spec.steps[i].depends) {
      auto it = index.find(d);
      if (it != index.end()) deps.insert(it->second);
    }
    for (size_t d : deps) {
      ++missing[i];
      dependents[d].push_back(i);
    }
  }
  std::vector<size_t> order;
  std::vector<bool> done(n, false);
  while (order.size() < n) {
    size_t pick = n;
    for (size_t i = 0; i < n; ++i) {
      if (!done[i] && missing[i] == 0) {
        pick = i;
        break;
      }
    }
    if (pick == n) break;
    done[pick] = true;
    order.push_back(pick);
    for (size_t d : dependents[pick]) --missing[d];
  }
  if (order.size() < n) {
    // Walk back along unfinished dependencies from an unfinished step until a step repeats:
    // that loop is a cycle to show.
    size_t start = 0;
    while (done[start]) ++start;
    std::vector<size_t> path;
    std::map<size_t, size_t> pos;
    size_t cur = start;
    while (!pos.count(cur)) {
      pos[cur] = path.size();
      path.push_back(cur);
      size_t next = cur;
      for (const auto& d : spec.steps[cur].depends) {
        auto it = index.find(d);
        if (it != index.end() && !done[it->second]) {
          next = it->second;
          break;
        }
      }
      cur = next;
    }
    std::string cycle;
    for (size_t i = pos[cur]; i < path.size(); ++i) cycle += spec.steps[path[i]].name + " -> ";
    cycle += spec.steps[cur].name;
    problems->push_back({fmt::format("steps[{}].depends", cur),
                         fmt::format("dependency cycle: {}", cycle)});
  }
  return order;
}

namespace {

// `workspace: {claim, path}` (pipeline_spec.h); the parameters are parsed before it.
void ParseWorkspace(Walker& w, const YAML::Node& ws, PipelineSpec* spec) {
  if (!ws.IsMap()) {
    w.Add("workspace", "must be a map: {claim: NAME, path: /workspace}");
  } else {
    w.CheckKeys(ws, "workspace", {"claim", "path"});
    Workspace space;
    space.claim = w.String(ws, "workspace", "claim").value_or("");
    space.path = w.String(ws, "workspace", "path").value_or(space.path);
    if (space.claim.empty()) {
      w.Add("workspace.claim", "required: the PersistentVolumeClaim every step mounts");
    } else if (auto uses = FindTemplates(space.claim); !uses.ok()) {
      w.Add("workspace.claim", uses.status().message());
    } else {
      for (const auto& u : *uses) {
        if (u.ref.kind != Ref::Kind::kParam || spec->FindParam(u.ref.param) == nullptr) {
          w.Add("workspace.claim", fmt::format("{{{{{}}}}}: only parameters of the pipeline "
                                               "can name the claim",
                                               u.ref.ToString()));
        }
      }
    }
    if (space.path.empty() || space.path[0] != '/') {
      w.Add("workspace.path", fmt::format("'{}' must be an absolute path", space.path));
    }
    spec->workspace = space;
  }
}

}  // namespace

PipelineSpec ParsePipelineSpec(const std::string& yaml, const std::string& base_dir,
                               std::vector<Problem>* problems) {
  PipelineSpec spec;
  spec.base_dir = base_dir;
  Walker w(problems);
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    w.Add(fmt::format("line {}", e.mark.line + 1), e.msg);
    return spec;
  }
  if (!root.IsMap()) {
    w.Add("", "a pipeline spec is a YAML map (name, parameters, steps)");
    return spec;
  }
  for (const auto& kv : root) {
    static const std::vector<std::string> kKnown = {"name", "description", "parameters",
                                                    "steps", "workspace"};
    std::string key = kv.first.Scalar();
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end()) {
      w.Add(key, fmt::format("unknown field{}", Hint(key, kKnown)));
    }
  }
  spec.name = w.String(root, "", "name").value_or("");
  if (spec.name.empty()) {
    w.Add("name", "required");
  } else if (!IsStepName(spec.name)) {
    w.Add("name", fmt::format("'{}' must be lowercase letters, digits and '-'", spec.name));
  }
  if (YAML::Node p = root["parameters"]; p && !p.IsNull()) ParseParameters(w, p, &spec);
  if (YAML::Node ws = root["workspace"]; ws && !ws.IsNull()) ParseWorkspace(w, ws, &spec);
  YAML::Node steps = root["steps"];
  if (!steps || !steps.IsSequence() || steps.size() == 0) {
    w.Add("steps", "required: a list of steps");
    return spec;
  }
  std::map<std::string, size_t> first_index;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string path = fmt::format("steps[{}]", i);
    Step s;
    if (!steps[i].IsMap()) {
      w.Add(path, "must be a map (name, command | job, depends, ...)");
    } else {
      ParseStep(w, steps[i], path, &s);
    }
    if (!s.name.empty()) {
      auto [it, fresh] = first_index.emplace(s.name, i);
      if (!fresh) {
        w.Add(path + ".name",
              fmt::format("duplicate step name '{}' (also steps[{}])", s.name, it->second));
      }
    }
    spec.steps.push_back(std::move(s));
  }
  // References between steps, once every step is known.
  std::vector<std::string> names;
  for (const auto& s : spec.steps) names.push_back(s.name);
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    const Step& s = spec.steps[i];
    const std::string path = fmt::format("steps[{}]", i);
    for (size_t j = 0; j < s.depends.size(); ++j) {
      const std::string& d = s.depends[j];
      if (d == s.name) {
        w.Add(fmt::format("{}.depends[{}]", path, j), "a step cannot depend on itself");
      } else if (!first_index.count(d)) {
        w.Add(fmt::format("{}.depends[{}]", path, j),
              fmt::format("unknown step '{}'{}", d, Hint(d, names)));
      }
    }
  }
  std::vector<Problem> cycle;
  TopologicalOrder(spec, &cycle);
  problems->insert(problems->end(), cycle.begin(), cycle.end());
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    const Step& s = spec.steps[i];
    const std::string path = fmt::format("steps[{}]", i);
    if (s.condition) {
      std::vector<Ref> refs;
      CollectRefs(*s.condition, &refs);
      for (const auto& r : refs) CheckRef(w, spec, s, r, path + ".when");
    }
    for (size_t j = 0; j < s.command.size(); ++j) {
      CheckTemplates(w, spec, s, s.command[j], fmt::format("{}.command[{}]", path, j));
    }
    if (!s.shell.empty()) CheckTemplates(w, spec, s, s.shell, path + ".command");
    for (const auto& [k, v] : s.env) CheckTemplates(w, spec, s, v, path + ".env." + k);
    if (!s.job.empty()) CheckTemplates(w, spec, s, s.job, path + ".job");
    if (!s.workdir.empty()) CheckTemplates(w, spec, s, s.workdir, path + ".workdir");
    for (size_t j = 0; j < s.inputs.size(); ++j) {
      CheckTemplates(w, spec, s, s.inputs[j], fmt::format("{}.inputs[{}]", path, j));
    }
    for (size_t j = 0; j < s.output_files.size(); ++j) {
      CheckTemplates(w, spec, s, s.output_files[j], fmt::format("{}.outputs.file[{}]", path, j));
    }
  }
  return spec;
}

Result<PipelineSpec> LoadPipelineSpec(const std::string& path, std::vector<Problem>* problems) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status().WithContext("the pipeline spec");
  return ParsePipelineSpec(*text, fs::absolute(path).parent_path().string(), problems);
}

Value ParamValue(const Parameter& param, const std::string& text) {
  switch (param.type) {
    case ParamType::kInt:
    case ParamType::kFloat:
      if (auto d = ParseDouble(text)) return Value::Number(*d);
      break;
    case ParamType::kBool: return Value::Bool(text == "true");
    case ParamType::kString: break;
  }
  return Value::String(text);
}

std::map<std::string, std::string> ResolveParameters(
    const PipelineSpec& spec, const std::map<std::string, std::string>& overrides,
    std::vector<Problem>* problems) {
  std::map<std::string, std::string> values;
  std::vector<std::string> names;
  for (const auto& p : spec.parameters) names.push_back(p.name);
  for (const auto& [k, v] : overrides) {
    if (!spec.FindParam(k)) {
      problems->push_back({"-p " + k, fmt::format("unknown parameter '{}'{}", k,
                                                   Hint(k, names))});
    }
  }
  for (const auto& p : spec.parameters) {
    auto it = overrides.find(p.name);
    if (it == overrides.end()) {
      if (p.has_default) {
        values[p.name] = p.default_value;
      } else {
        problems->push_back({"-p " + p.name,
                             fmt::format("required: the parameter has no default (pass -p {}=...)",
                                         p.name)});
      }
      continue;
    }
    const std::string& v = it->second;
    if (std::string e = TypeError(p.type, v); !e.empty()) {
      problems->push_back({"-p " + p.name, fmt::format("{} (the parameter's type is {})", e,
                                                        ParamTypeName(p.type))});
      continue;
    }
    if (!p.enum_values.empty() &&
        std::find(p.enum_values.begin(), p.enum_values.end(), v) == p.enum_values.end()) {
      problems->push_back({"-p " + p.name, fmt::format("'{}' is not one of {}", v,
                                                        JoinNames(p.enum_values))});
      continue;
    }
    values[p.name] = v;
  }
  return values;
}

void CheckJobSteps(const PipelineSpec& spec, const std::map<std::string, std::string>& params,
                   std::vector<Problem>* problems) {
  for (size_t i = 0; i < spec.steps.size(); ++i) {
    const Step& s = spec.steps[i];
    if (s.job.empty()) continue;
    const std::string where = fmt::format("steps[{}].job", i);
    auto lookup_params = [&](const Ref& r) -> Result<std::string> {
      if (r.kind != Ref::Kind::kParam) return FailedPrecondition("step output");
      auto it = params.find(r.param);
      if (it == params.end()) return NotFound("unknown parameter '{}'", r.param);
      return it->second;
    };
    auto job_path = SubstituteTemplates(s.job, lookup_params);
    if (!job_path.ok()) continue;  // depends on a step output: checked when it runs
    fs::path p = fs::path(*job_path).is_absolute() ? fs::path(*job_path)
                                                   : fs::path(spec.base_dir) / *job_path;
    auto text = ReadFileToString(p.string());
    if (!text.ok()) {
      problems->push_back({where, fmt::format("cannot read the job spec {}", p.string())});
      continue;
    }
    auto substituted = SubstituteTemplatesInYaml(*text, lookup_params);
    if (!substituted.ok()) {
      if (substituted.status().code() != StatusCode::kFailedPrecondition) {
        problems->push_back({where, fmt::format("{}: {}", p.string(),
                                                substituted.status().message())});
      }
      continue;
    }
    std::vector<Problem> job_problems;
    launch::JobSpec job = launch::ParseJobSpec(*substituted, &job_problems);
    // What the step's backend can never honour is known now, before earlier steps run
    // (the backend's own checks of this machine or cluster come when the step starts).
    if (job.targets.empty()) {
      launch::CheckUnsupportedFields(job, s.backend, &job_problems);
    }
    for (const auto& jp : job_problems) {
      problems->push_back({where, fmt::format("{}: {}", p.filename().string(), jp.ToString())});
    }
  }
}

}  // namespace cohort::pipeline
