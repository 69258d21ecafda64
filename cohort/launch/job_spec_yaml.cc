// A JobSpec as YAML (JobSpecToYaml: what the job history stores and --dry-run shows) and
// the spec a backend runs, its override merged (SpecForBackend; see job_spec.h).
// Thread-safety: pure functions.
#include "cohort/launch/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

namespace cohort::launch {

namespace {

// `key: {k: v, ...}` of a map with entries; nothing when it is empty.
template <typename Map>
void EmitMap(YAML::Emitter& e, const char* key, const Map& map) {
  if (map.empty()) return;
  e << YAML::Key << key << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : map) e << YAML::Key << k << YAML::Value << v;
  e << YAML::EndMap;
}

// `key: value` unless the text is empty.
void EmitText(YAML::Emitter& e, const char* key, const std::string& value) {
  if (!value.empty()) e << YAML::Key << key << YAML::Value << value;
}

void EmitResources(YAML::Emitter& e, const Resources& r) {
  if (r.cpu <= 0 && r.memory_bytes <= 0 && r.gpu <= 0 && r.network_devices.empty() &&
      r.extended.empty()) {
    return;
  }
  e << YAML::Key << "resources" << YAML::Value << YAML::BeginMap;
  if (r.cpu > 0) e << YAML::Key << "cpu" << YAML::Value << r.cpu;
  if (r.memory_bytes > 0) e << YAML::Key << "memory" << YAML::Value << r.memory_text;
  if (r.gpu > 0) e << YAML::Key << "gpu" << YAML::Value << r.gpu;
  if (!r.network_devices.empty()) {
    e << YAML::Key << "network_devices" << YAML::Value << YAML::Flow << r.network_devices;
  }
  EmitMap(e, "extended", r.extended);
  e << YAML::EndMap;
}

void EmitStorage(YAML::Emitter& e, const JobSpec& s) {
  if (!s.volumes.empty()) {
    e << YAML::Key << "volumes" << YAML::Value << YAML::BeginSeq;
    for (const auto& v : s.volumes) {
      e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << v.name;
      EmitText(e, "host_path", v.host_path);
      EmitText(e, "claim", v.claim);
      if (!v.nfs_server.empty()) {
        e << YAML::Key << "nfs" << YAML::Value << YAML::BeginMap << YAML::Key << "server"
          << YAML::Value << v.nfs_server << YAML::Key << "path" << YAML::Value << v.nfs_path
          << YAML::EndMap;
      }
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  if (!s.mounts.empty()) {
    e << YAML::Key << "mounts" << YAML::Value << YAML::BeginSeq;
    for (const auto& m : s.mounts) {
      e << YAML::BeginMap << YAML::Key << "volume" << YAML::Value << m.volume << YAML::Key
        << "path" << YAML::Value << m.path << YAML::Key << "read_only" << YAML::Value
        << m.read_only << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
}

void EmitArray(YAML::Emitter& e, const ArraySource& a) {
  if (a.empty()) return;
  e << YAML::Key << "array" << YAML::Value << YAML::BeginMap;
  EmitText(e, "range", a.range);
  EmitText(e, "manifest", a.manifest);
  EmitText(e, "from_sql", a.from_sql);
  EmitText(e, "db", a.db);
  if (a.concurrency > 0) e << YAML::Key << "concurrency" << YAML::Value << a.concurrency;
  if (!a.columns.empty()) e << YAML::Key << "columns" << YAML::Value << YAML::Flow << a.columns;
  EmitText(e, "target_by", a.target_by);
  e << YAML::EndMap;
}

void EmitPlacement(YAML::Emitter& e, const Placement& p) {
  if (p.empty()) return;
  e << YAML::Key << "placement" << YAML::Value << YAML::BeginMap;
  EmitMap(e, "node_selector", p.node_selector);
  if (!p.tolerations.empty()) {
    e << YAML::Key << "tolerations" << YAML::Value << YAML::BeginSeq;
    for (const Toleration& t : p.tolerations) {
      e << YAML::BeginMap;
      EmitText(e, "key", t.key);
      e << YAML::Key << "operator" << YAML::Value << t.op;
      EmitText(e, "value", t.value);
      EmitText(e, "effect", t.effect);
      if (t.toleration_seconds) {
        e << YAML::Key << "toleration_seconds" << YAML::Value << *t.toleration_seconds;
      }
      e << YAML::EndMap;
    }
    e << YAML::EndSeq;
  }
  e << YAML::EndMap;
}

void EmitKubernetes(YAML::Emitter& e, const KubernetesSpec& k) {
  if (!k.master && k.clean_pod_policy.empty() && !k.ttl_seconds_after_finished) return;
  e << YAML::Key << "kubernetes" << YAML::Value << YAML::BeginMap;
  if (k.master) e << YAML::Key << "master" << YAML::Value << *k.master;
  EmitText(e, "clean_pod_policy", k.clean_pod_policy);
  if (k.ttl_seconds_after_finished) {
    e << YAML::Key << "ttl_seconds_after_finished" << YAML::Value << *k.ttl_seconds_after_finished;
  }
  e << YAML::EndMap;
}

void EmitTargets(YAML::Emitter& e, const std::vector<Target>& targets) {
  if (targets.empty()) return;
  e << YAML::Key << "targets" << YAML::Value << YAML::BeginSeq;
  for (const Target& t : targets) {
    e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << t.name << YAML::Key << "backend"
      << YAML::Value << t.backend;
    if (t.concurrency > 0) e << YAML::Key << "concurrency" << YAML::Value << t.concurrency;
    EmitText(e, "context", t.context);
    EmitText(e, "namespace", t.kube_namespace);
    EmitText(e, "flavor", t.flavor);
    EmitText(e, "cluster", t.cluster);
    EmitText(e, "partition", t.partition);
    EmitMap(e, "env", t.env);
    e << YAML::EndMap;
  }
  e << YAML::EndSeq;
}

}  // namespace

namespace {

// `over` merged over `base`: maps key by key (recursively), anything else replaced.
YAML::Node MergeYaml(const YAML::Node& base, const YAML::Node& over) {
  if (!base || !base.IsMap() || !over.IsMap()) return YAML::Clone(over);
  YAML::Node out = YAML::Clone(base);
  for (const auto& entry : over) {
    const std::string key = entry.first.as<std::string>("");
    out[key] = base[key] ? MergeYaml(base[key], entry.second) : YAML::Clone(entry.second);
  }
  return out;
}

}  // namespace

std::string JobSpecToYaml(const JobSpec& s) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << s.name;
  EmitText(e, "image", s.image);
  e << YAML::Key << (s.module ? "module" : "entrypoint") << YAML::Value << s.entrypoint;
  if (!s.args.empty()) e << YAML::Key << "args" << YAML::Value << YAML::Flow << s.args;
  e << YAML::Key << "nnodes" << YAML::Value << s.NnodesText();
  e << YAML::Key << "nproc_per_node" << YAML::Value << s.nproc_per_node;
  EmitResources(e, s.resources);
  EmitMap(e, "env", s.env);
  EmitStorage(e, s);
  e << YAML::Key << "max_restarts" << YAML::Value << s.max_restarts;
  EmitText(e, "queue", s.queue);
  EmitText(e, "priority", s.priority);
  e << YAML::Key << "rdzv" << YAML::Value << YAML::BeginMap << YAML::Key << "backend"
    << YAML::Value << s.rdzv.backend;
  EmitText(e, "endpoint", s.rdzv.endpoint);
  e << YAML::Key << "port" << YAML::Value << s.rdzv.port << YAML::EndMap;
  EmitArray(e, s.array);
  EmitPlacement(e, s.placement);
  if (s.metrics.enabled()) {
    e << YAML::Key << "metrics" << YAML::Value << YAML::BeginMap << YAML::Key << "port"
      << YAML::Value << s.metrics.port;
    EmitText(e, "host", s.metrics.host);
    e << YAML::EndMap;
  }
  EmitKubernetes(e, s.kubernetes);
  EmitTargets(e, s.targets);
  if (!s.overrides.empty()) {
    e << YAML::Key << "overrides" << YAML::Value << YAML::BeginMap;
    for (const auto& [backend, text] : s.overrides) {
      e << YAML::Key << backend << YAML::Value << YAML::Load(text);
    }
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

JobSpec SpecForBackend(const JobSpec& spec, const std::string& backend,
                       std::vector<Problem>* problems) {
  const std::string name = backend == "k8s" ? "kubernetes" : backend;
  JobSpec out = spec;
  out.overrides.clear();
  const auto it = spec.overrides.find(name);
  if (it == spec.overrides.end()) return out;
  const YAML::Node merged = MergeYaml(YAML::Load(JobSpecToYaml(out)), YAML::Load(it->second));
  std::vector<Problem> found;
  out = ParseJobSpec(YAML::Dump(merged), &found);
  for (Problem& p : found) {
    problems->push_back({"overrides." + name + (p.where.empty() ? "" : "." + p.where),
                         std::move(p.what)});
  }
  return out;
}

}  // namespace cohort::launch
