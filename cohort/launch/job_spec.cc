// JobSpec parsing and validation (see job_spec.h; the YAML emitter and the overrides'
// merge are in job_spec_yaml.cc). Thread-safety: pure functions.
#include "cohort/launch/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <regex>
#include <set>
#include <tuple>

#include "cohort/base/file.h"
#include "cohort/base/strings.h"
#include "cohort/launch/spec_walker.h"

namespace cohort::launch {
namespace {

using Walker = SpecWalker;

// The name part of a qualified name: up to 63 of [A-Za-z0-9-_.], alphanumeric at both ends.
bool IsQualifiedNamePart(const std::string& s) {
  static const std::regex name("[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?");
  return std::regex_match(s, name);
}

// A label key: [prefix/]name, the prefix a DNS subdomain.
bool IsQualifiedName(const std::string& s) {
  auto slash = s.find('/');
  if (slash == std::string::npos) return IsQualifiedNamePart(s);
  return IsDnsSubdomain(s.substr(0, slash)) && IsQualifiedNamePart(s.substr(slash + 1));
}

// DOMAIN/NAME with DOMAIN a dotted DNS subdomain outside kubernetes.io (Kubernetes
// reserves it).
bool IsExtendedResourceName(const std::string& s) {
  auto slash = s.find('/');
  if (slash == std::string::npos) return false;
  const std::string domain = s.substr(0, slash);
  return domain.find('.') != std::string::npos && IsQualifiedName(s) &&
         domain != "kubernetes.io" && !EndsWith(domain, ".kubernetes.io");
}

// A list of maps at `path` ("volumes", "placement.tolerations"): calls `each(where, entry)`
// for every entry that is a map ("volumes[2]"), after reporting its keys not in `keys`. A
// value that is not a list (`list_what`) or an entry that is not a map (`map_what`) is a
// problem.
template <typename Each>
void ForEachMapEntry(Walker& w, const YAML::Node& n, const std::string& path,
                     const std::string& list_what, const std::string& map_what,
                     const std::vector<std::string>& keys, Each each) {
  if (!n.IsSequence()) {
    w.Add(path, list_what);
    return;
  }
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string where = fmt::format("{}[{}]", path, i);
    const YAML::Node& entry = n[i];
    if (!entry.IsMap()) {
      w.Add(where, map_what);
      continue;
    }
    w.CheckKeys(entry, where, keys);
    each(where, entry);
  }
}

// A map of environment variables at `path` ("env", "targets[1].env").
void ParseEnv(Walker& w, const YAML::Node& n, const std::string& path,
              std::map<std::string, std::string>* out) {
  if (!n.IsMap()) {
    w.Add(path, "must be a map of NAME: value");
    return;
  }
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    if (!IsEnvName(key)) {
      w.Add(path + "." + key, "is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
    } else if (!kv.second.IsScalar()) {
      w.Add(path + "." + key, "must be a single value");
    } else {
      (*out)[key] = kv.second.Scalar();
    }
  }
}

void ParseResources(Walker& w, const YAML::Node& n, Resources* r) {
  const std::string path = "resources";
  if (!n.IsMap()) {
    w.Add(path, "must be a map (cpu, memory, gpu, network_devices, extended)");
    return;
  }
  w.CheckKeys(n, path, {"cpu", "memory", "gpu", "network_devices", "extended"});
  if (auto cpu = w.String(n, path, "cpu")) {
    // Kubernetes style "500m" (millicores) or a number of cores.
    std::string text = *cpu;
    double value = -1;
    if (!text.empty() && text.back() == 'm') {
      if (auto milli = ParseInt64(text.substr(0, text.size() - 1))) value = *milli / 1000.0;
    } else if (auto d = ParseDouble(text)) {
      value = *d;
    }
    if (value <= 0 || !std::isfinite(value)) {
      w.Add("resources.cpu", fmt::format("'{}' is not a positive number of cores (e.g. 4 or 500m)",
                                         text));
    } else {
      r->cpu = value;
    }
  }
  if (auto mem = w.String(n, path, "memory")) {
    auto bytes = ParseMemoryQuantity(*mem);
    if (!bytes || *bytes <= 0) {
      w.Add("resources.memory",
            fmt::format("'{}' is not a memory size (e.g. 8Gi, 512Mi, 2G or a number of bytes)",
                        *mem));
    } else {
      r->memory_bytes = *bytes;
      r->memory_text = *mem;
    }
  }
  if (auto gpu = w.Int(n, path, "gpu", 0, 64)) r->gpu = static_cast<int>(*gpu);
  r->network_devices = w.StringList(n, path, "network_devices");
  if (YAML::Node ext = n["extended"]) {
    if (!ext.IsMap()) {
      w.Add("resources.extended",
            "must be a map of resource: count (e.g. aws.amazon.com/neuron: 1)");
      return;
    }
    for (const auto& kv : ext) {
      const std::string key = kv.first.Scalar();
      const std::string where = "resources.extended." + key;
      if (!IsExtendedResourceName(key)) {
        w.Add(where, "is not an extended resource name: DOMAIN/NAME, e.g. "
                     "aws.amazon.com/neuron or vpc.amazonaws.com/efa (cpu, memory and gpu "
                     "have their own fields)");
        continue;
      }
      auto count = kv.second.IsScalar() ? ParseInt64(kv.second.Scalar()) : std::nullopt;
      if (!count || *count < 1 || *count > 1000000) {
        w.Add(where, "must be a whole number of at least 1 (extended resources are counted, "
                     "not shared)");
        continue;
      }
      if (key == "nvidia.com/gpu" && r->gpu > 0) {
        w.Add(where, "repeats resources.gpu (which is nvidia.com/gpu); give one of them");
        continue;
      }
      r->extended[key] = *count;
    }
  }
}

bool IsLabelValue(const std::string& s) {
  static const std::regex value("([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?");
  return std::regex_match(s, value);
}

// One entry of placement.tolerations, at `where`.
Toleration ParseToleration(Walker& w, const YAML::Node& t, const std::string& where) {
  Toleration tol;
  tol.key = w.String(t, where, "key").value_or("");
  tol.op = w.String(t, where, "operator").value_or("Equal");
  tol.value = w.String(t, where, "value").value_or("");
  tol.effect = w.String(t, where, "effect").value_or("");
  if (t["toleration_seconds"]) {
    tol.toleration_seconds = w.Int(t, where, "toleration_seconds", 0, 1LL << 40);
  }
  if (tol.op != "Equal" && tol.op != "Exists") {
    w.Add(where + ".operator", fmt::format("'{}' is not Equal or Exists", tol.op));
  }
  if (!tol.key.empty() && !IsQualifiedName(tol.key)) {
    w.Add(where + ".key", fmt::format("'{}' is not a taint key ([prefix/]name)", tol.key));
  }
  if (tol.key.empty() && tol.op != "Exists") {
    w.Add(where + ".key", "required unless operator is Exists (which then tolerates "
                          "every taint)");
  }
  if (tol.op == "Exists" && !tol.value.empty()) {
    w.Add(where + ".value", "must be empty with operator Exists");
  }
  if (!tol.effect.empty() && tol.effect != "NoSchedule" && tol.effect != "PreferNoSchedule" &&
      tol.effect != "NoExecute") {
    w.Add(where + ".effect",
          fmt::format("'{}' is not NoSchedule, PreferNoSchedule or NoExecute", tol.effect));
  }
  if (tol.toleration_seconds && tol.effect != "NoExecute") {
    w.Add(where + ".toleration_seconds", "only applies with effect NoExecute");
  }
  return tol;
}

void ParsePlacement(Walker& w, const YAML::Node& n, Placement* p) {
  const std::string path = "placement";
  if (!n.IsMap()) {
    w.Add(path, "must be a map {node_selector, tolerations}");
    return;
  }
  w.CheckKeys(n, path, {"node_selector", "tolerations"});
  if (YAML::Node sel = n["node_selector"]) {
    if (!sel.IsMap()) {
      w.Add("placement.node_selector", "must be a map of node label: value");
    } else {
      for (const auto& kv : sel) {
        const std::string key = kv.first.Scalar();
        const std::string where = "placement.node_selector." + key;
        if (!IsQualifiedName(key)) {
          w.Add(where, "is not a node label key ([prefix/]name, e.g. "
                       "node.kubernetes.io/instance-type)");
        } else if (!kv.second.IsScalar() || !IsLabelValue(kv.second.Scalar())) {
          w.Add(where, "must be a label value (at most 63 letters, digits, '-', '_', '.')");
        } else {
          p->node_selector[key] = kv.second.Scalar();
        }
      }
    }
  }
  if (YAML::Node tols = n["tolerations"]) {
    ForEachMapEntry(w, tols, "placement.tolerations",
                    "must be a list of {key, operator, value, effect}",
                    "must be a map {key, operator, value, effect, toleration_seconds}",
                    {"key", "operator", "value", "effect", "toleration_seconds"},
                    [&](const std::string& where, const YAML::Node& t) {
                      p->tolerations.push_back(ParseToleration(w, t, where));
                    });
  }
}

void ParseMetrics(Walker& w, const YAML::Node& n, MetricsSpec* m) {
  if (!n.IsMap()) {
    w.Add("metrics", "must be a map {port, host} (port 0: any free port)");
    return;
  }
  w.CheckKeys(n, "metrics", {"port", "host"});
  if (!n["port"]) w.Add("metrics.port", "required (e.g. 9400, or 0 for any free port)");
  if (auto port = w.Int(n, "metrics", "port", 0, 65535)) m->port = static_cast<int>(*port);
  m->host = w.String(n, "metrics", "host").value_or("");
}

void ParseKubernetes(Walker& w, const YAML::Node& n, KubernetesSpec* k) {
  if (!n.IsMap()) {
    w.Add("kubernetes", "must be a map {master, clean_pod_policy, ttl_seconds_after_finished}");
    return;
  }
  w.CheckKeys(n, "kubernetes", {"master", "clean_pod_policy", "ttl_seconds_after_finished"});
  if (auto m = w.String(n, "kubernetes", "master")) {
    if (auto b = ParseBool(*m)) {
      k->master = *b;
    } else {
      w.Add("kubernetes.master", fmt::format("'{}' is not true or false", *m));
    }
  }
  k->clean_pod_policy = w.String(n, "kubernetes", "clean_pod_policy").value_or("");
  if (!k->clean_pod_policy.empty() && k->clean_pod_policy != "None" &&
      k->clean_pod_policy != "Running" && k->clean_pod_policy != "All") {
    w.Add("kubernetes.clean_pod_policy",
          fmt::format("'{}' is not None, Running or All", k->clean_pod_policy));
  }
  if (n["ttl_seconds_after_finished"]) {
    k->ttl_seconds_after_finished =
        w.Int(n, "kubernetes", "ttl_seconds_after_finished", 0, 1LL << 31);
  }
}

// One entry of targets, at `path`; `names` holds the names of the earlier ones.
Target ParseTarget(Walker& w, const YAML::Node& t, const std::string& path,
                   std::set<std::string>* names) {
  Target target;
  target.name = w.String(t, path, "name").value_or("");
  if (target.name.empty()) {
    w.Add(path + ".name", "required (the value elements use to pick this target)");
  } else if (!names->insert(target.name).second) {
    w.Add(path + ".name", fmt::format("'{}' names an earlier target too", target.name));
  }
  target.backend = w.String(t, path, "backend").value_or("");
  if (target.backend == "k8s") target.backend = "kubernetes";
  if (target.backend == "kubernetes" && !target.name.empty() && !IsDnsLabel(target.name)) {
    w.Add(path + ".name",
          fmt::format("'{}': a kubernetes target names its objects <job>-<target>, so use "
                      "lowercase letters, digits and '-'",
                      target.name));
  }
  if (target.backend != "local" && target.backend != "slurm" && target.backend != "kubernetes") {
    w.Add(path + ".backend", target.backend.empty()
                                 ? std::string("required: local, slurm or kubernetes")
                                 : fmt::format("'{}' is not local, slurm or kubernetes",
                                               target.backend));
  }
  if (auto c = w.Int(t, path, "concurrency", 1, 1000000)) {
    target.concurrency = static_cast<int>(*c);
  }
  target.context = w.String(t, path, "context").value_or("");
  target.kube_namespace = w.String(t, path, "namespace").value_or("");
  target.flavor = w.String(t, path, "flavor").value_or("");
  target.cluster = w.String(t, path, "cluster").value_or("");
  target.partition = w.String(t, path, "partition").value_or("");
  // Fields of one backend only: (field, value, the backend it belongs to).
  for (const auto& [field, value, owner] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"context", target.context, "kubernetes"},
           {"namespace", target.kube_namespace, "kubernetes"},
           {"flavor", target.flavor, "kubernetes"},
           {"cluster", target.cluster, "slurm"},
           {"partition", target.partition, "slurm"}}) {
    if (!value.empty() && target.backend != owner) {
      w.Add(path + "." + field, fmt::format("only applies to the {} backend", owner));
    }
  }
  if (YAML::Node env = t["env"]) ParseEnv(w, env, path + ".env", &target.env);
  return target;
}

void ParseTargets(Walker& w, const YAML::Node& n, std::vector<Target>* out) {
  constexpr const char* kWhat =
      "must be a list of {name, backend, ...} (one entry per place elements run)";
  if (n.IsSequence() && n.size() == 0) {
    w.Add("targets", kWhat);
    return;
  }
  std::set<std::string> names;
  ForEachMapEntry(w, n, "targets", kWhat,
                  "must be a map {name, backend, concurrency, context, namespace, flavor, "
                  "cluster, partition, env}",
                  {"name", "backend", "concurrency", "context", "namespace", "flavor", "cluster",
                   "partition", "env"},
                  [&](const std::string& path, const YAML::Node& t) {
                    out->push_back(ParseTarget(w, t, path, &names));
                  });
}

// One entry of volumes, at `path`; `names` holds the names of the earlier ones.
Volume ParseVolume(Walker& w, const YAML::Node& v, const std::string& path,
                   std::set<std::string>* names) {
  Volume vol;
  vol.name = w.String(v, path, "name").value_or("");
  if (vol.name.empty()) {
    w.Add(path + ".name", "required");
  } else if (!IsDnsLabel(vol.name)) {
    w.Add(path + ".name", fmt::format("'{}' must be lowercase letters, digits and '-'", vol.name));
  } else if (!names->insert(vol.name).second) {
    w.Add(path + ".name", fmt::format("'{}' is used by an earlier volume", vol.name));
  }
  vol.host_path = w.String(v, path, "host_path").value_or("");
  vol.claim = w.String(v, path, "claim").value_or("");
  if (YAML::Node nfs = v["nfs"]) {
    if (!nfs.IsMap()) {
      w.Add(path + ".nfs", "must be a map {server, path}");
    } else {
      w.CheckKeys(nfs, path + ".nfs", {"server", "path"});
      vol.nfs_server = w.String(nfs, path + ".nfs", "server").value_or("");
      vol.nfs_path = w.String(nfs, path + ".nfs", "path").value_or("");
      if (vol.nfs_server.empty()) w.Add(path + ".nfs.server", "required");
      if (vol.nfs_path.empty()) w.Add(path + ".nfs.path", "required");
    }
  }
  int kinds = !vol.host_path.empty() + !vol.claim.empty() + !vol.nfs_server.empty();
  if (kinds != 1 && !(kinds == 0 && v["nfs"])) {
    w.Add(path, "needs exactly one of host_path, claim or nfs");
  }
  if (!vol.host_path.empty() && vol.host_path[0] != '/') {
    w.Add(path + ".host_path", fmt::format("'{}' must be an absolute path", vol.host_path));
  }
  return vol;
}

void ParseVolumes(Walker& w, const YAML::Node& n, std::vector<Volume>* out) {
  std::set<std::string> names;
  ForEachMapEntry(w, n, "volumes", "must be a list of {name, host_path | claim | nfs}",
                  "must be a map {name, host_path | claim | nfs}",
                  {"name", "host_path", "claim", "nfs"},
                  [&](const std::string& path, const YAML::Node& v) {
                    out->push_back(ParseVolume(w, v, path, &names));
                  });
}

// One entry of mounts, at `path`, of one of `volumes`.
Mount ParseMount(Walker& w, const YAML::Node& m, const std::string& path,
                 const std::vector<Volume>& volumes) {
  Mount mount;
  mount.volume = w.String(m, path, "volume").value_or("");
  mount.path = w.String(m, path, "path").value_or("");
  if (auto ro = w.String(m, path, "read_only")) {
    auto b = ParseBool(*ro);
    if (!b) {
      w.Add(path + ".read_only", fmt::format("'{}' is not true or false", *ro));
    } else {
      mount.read_only = *b;
    }
  }
  if (mount.volume.empty()) {
    w.Add(path + ".volume", "required (the name of an entry of volumes)");
  } else if (std::none_of(volumes.begin(), volumes.end(),
                          [&](const Volume& v) { return v.name == mount.volume; })) {
    w.Add(path + ".volume", fmt::format("no volume named '{}' in volumes", mount.volume));
  }
  if (mount.path.empty() || mount.path[0] != '/') {
    w.Add(path + ".path", mount.path.empty()
                              ? std::string("required (where the volume appears, e.g. /data)")
                              : fmt::format("'{}' must be an absolute path", mount.path));
  }
  return mount;
}

void ParseMounts(Walker& w, const YAML::Node& n, const std::vector<Volume>& volumes,
                 std::vector<Mount>* out) {
  ForEachMapEntry(w, n, "mounts", "must be a list of {volume, path, read_only}",
                  "must be a map {volume, path, read_only}", {"volume", "path", "read_only"},
                  [&](const std::string& path, const YAML::Node& m) {
                    out->push_back(ParseMount(w, m, path, volumes));
                  });
}

void ParseArray(Walker& w, const YAML::Node& n, ArraySource* a) {
  const std::string path = "array";
  if (n.IsScalar()) {  // array: "0-99"
    a->range = n.Scalar();
  } else if (!n.IsMap()) {
    w.Add(path, "must be a range such as \"0-99\" or a map {range | manifest | from_sql, db, "
                "concurrency}");
    return;
  } else {
    w.CheckKeys(n, path, {"range", "manifest", "from_sql", "db", "concurrency", "columns",
                          "target_by"});
    a->range = w.String(n, path, "range").value_or("");
    a->manifest = w.String(n, path, "manifest").value_or("");
    a->from_sql = w.String(n, path, "from_sql").value_or("");
    a->db = w.String(n, path, "db").value_or("");
    if (auto c = w.Int(n, path, "concurrency", 1, 1000000)) a->concurrency = static_cast<int>(*c);
    if (n["columns"] && n["columns"].IsScalar()) {
      a->columns = Split(n["columns"].Scalar(), ',');  // "region,path" as on the command line
      for (auto& c : a->columns) c = std::string(Trim(c));
    } else {
      a->columns = w.StringList(n, path, "columns");
    }
    a->target_by = w.String(n, path, "target_by").value_or("");
  }
  if (!a->columns.empty() && a->manifest.empty()) {
    w.Add("array.columns", "only used with manifest (it names the columns of a manifest "
                           "without header row)");
  }
  int sources = !a->range.empty() + !a->manifest.empty() + !a->from_sql.empty();
  if (sources > 1) w.Add(path, "give only one of range, manifest and from_sql");
  if (!a->from_sql.empty() && a->db.empty()) {
    w.Add("array.db", "required with from_sql (sqlite:///path.db or postgresql://user@host/db)");
  }
  if (a->from_sql.empty() && !a->db.empty()) w.Add("array.db", "only used with from_sql");
}

}  // namespace

std::string JobSpec::NnodesText() const {
  return min_nodes == max_nodes ? std::to_string(min_nodes)
                                : fmt::format("{}:{}", min_nodes, max_nodes);
}

std::optional<int64_t> ParseMemoryQuantity(const std::string& text) {
  static const std::regex re("([0-9]+(\\.[0-9]+)?)\\s*(Ki|Mi|Gi|Ti|K|k|M|G|T|)B?");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return std::nullopt;
  double value = std::stod(m[1].str());
  const std::string unit = m[3].str();
  double scale = 1;
  if (unit == "Ki") scale = 1024.0;
  if (unit == "Mi") scale = 1024.0 * 1024;
  if (unit == "Gi") scale = 1024.0 * 1024 * 1024;
  if (unit == "Ti") scale = 1024.0 * 1024 * 1024 * 1024;
  if (unit == "K" || unit == "k") scale = 1e3;
  if (unit == "M") scale = 1e6;
  if (unit == "G") scale = 1e9;
  if (unit == "T") scale = 1e12;
  double bytes = value * scale;
  if (bytes > 9e18) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

namespace {

// `rdzv: {backend, endpoint, port}`. An etcd backend without endpoint is up to the
// backend: kubernetes deploys one, slurm refuses it (see their Validate).
void ParseRdzv(Walker& w, const YAML::Node& r, Rendezvous* rdzv) {
  if (!r.IsMap()) {
    w.Add("rdzv", "must be a map {backend, endpoint, port}");
    return;
  }
  w.CheckKeys(r, "rdzv", {"backend", "endpoint", "port"});
  rdzv->backend = w.String(r, "rdzv", "backend").value_or("c10d");
  if (rdzv->backend == "static" || rdzv->backend == "store") rdzv->backend = "c10d";
  if (rdzv->backend != "c10d" && rdzv->backend != "etcd") {
    w.Add("rdzv.backend", fmt::format("'{}' is not c10d or etcd", rdzv->backend));
  }
  rdzv->endpoint = w.String(r, "rdzv", "endpoint").value_or("");
  if (auto p = w.Int(r, "rdzv", "port", 1, 65535)) rdzv->port = static_cast<int>(*p);
}

// `overrides: {backend: {fields}}` (job_spec.h): each kept as YAML text, validated when it
// is merged (SpecForBackend).
void ParseOverrides(Walker& w, const YAML::Node& o, JobSpec* spec) {
  if (!o.IsMap()) {
    w.Add("overrides", "must map backends to fields: {kubernetes: {...}, slurm: {...}}");
  } else {
    w.CheckKeys(o, "overrides", {"local", "slurm", "kubernetes"});
    for (const auto& entry : o) {
      const std::string backend = entry.first.as<std::string>("");
      if (backend != "local" && backend != "slurm" && backend != "kubernetes") continue;
      if (!entry.second.IsMap()) {
        w.Add("overrides." + backend, "must be a map of spec fields (e.g. {queue: gpu})");
        continue;
      }
      if (entry.second["overrides"] || entry.second["targets"]) {
        w.Add("overrides." + backend, "cannot hold overrides or targets");
        continue;
      }
      spec->overrides[backend] = YAML::Dump(entry.second);
    }
  }
}

}  // namespace

JobSpec ParseJobSpec(const std::string& yaml, std::vector<Problem>* problems) {
  JobSpec spec;
  Walker w(problems);
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    w.Add(fmt::format("line {}, column {}", e.mark.line + 1, e.mark.column + 1),
          fmt::format("YAML syntax error: {}", e.msg));
    return spec;
  }
  if (!root || root.IsNull()) {
    w.Add("", "the job spec is empty (it needs at least name and entrypoint)");
    return spec;
  }
  if (!root.IsMap()) {
    w.Add("", "the job spec must be a YAML map (name: ..., entrypoint: ..., ...)");
    return spec;
  }
  w.CheckKeys(root, "",
              {"name", "image", "entrypoint", "module", "args", "nnodes", "nproc_per_node", "resources",
               "env", "volumes", "mounts", "max_restarts", "queue", "priority", "rdzv", "array",
               "placement", "metrics", "kubernetes", "targets", "overrides"});

  spec.name = w.String(root, "", "name").value_or("");
  if (spec.name.empty()) {
    w.Add("name", "required (lowercase letters, digits and '-', e.g. fmnist-train)");
  } else if (!IsDnsLabel(spec.name)) {
    w.Add("name", fmt::format("'{}' must be at most 63 lowercase letters, digits and '-', "
                              "starting and ending with a letter or digit",
                              spec.name));
  }
  spec.image = w.String(root, "", "image").value_or("");
  spec.entrypoint = w.String(root, "", "entrypoint").value_or("");
  if (auto module = w.String(root, "", "module")) {
    if (!spec.entrypoint.empty()) {
      w.Add("module", "give entrypoint or module, not both (module: pkg.train runs "
                      "python -m pkg.train)");
    }
    spec.entrypoint = *module;
    spec.module = true;
  }
  if (spec.entrypoint.empty()) {
    w.Add("entrypoint", "required (the program every worker runs, e.g. python3, ./train or "
                        "train.py; or module: pkg.train)");
  }
  spec.args = w.StringList(root, "", "args");

  if (auto nnodes = w.String(root, "", "nnodes")) {
    if (auto range = ParseNnodesText(*nnodes); !range.ok()) {
      w.Add("nnodes", range.status().message());
    } else {
      std::tie(spec.min_nodes, spec.max_nodes) = *range;
    }
  }
  if (auto n = w.Int(root, "", "nproc_per_node", 1, 4096)) spec.nproc_per_node = static_cast<int>(*n);
  if (YAML::Node r = root["resources"]) ParseResources(w, r, &spec.resources);

  if (YAML::Node env = root["env"]) ParseEnv(w, env, "env", &spec.env);
  if (YAML::Node v = root["volumes"]) ParseVolumes(w, v, &spec.volumes);
  if (YAML::Node m = root["mounts"]) ParseMounts(w, m, spec.volumes, &spec.mounts);
  if (auto r = w.Int(root, "", "max_restarts", 0, 1000000)) spec.max_restarts = static_cast<int>(*r);
  spec.queue = w.String(root, "", "queue").value_or("");
  spec.priority = w.String(root, "", "priority").value_or("");

  if (YAML::Node r = root["rdzv"]) ParseRdzv(w, r, &spec.rdzv);
  if (YAML::Node a = root["array"]) ParseArray(w, a, &spec.array);
  if (YAML::Node p = root["placement"]) ParsePlacement(w, p, &spec.placement);
  if (YAML::Node m = root["metrics"]) ParseMetrics(w, m, &spec.metrics);
  if (YAML::Node k = root["kubernetes"]) ParseKubernetes(w, k, &spec.kubernetes);
  if (YAML::Node t = root["targets"]) ParseTargets(w, t, &spec.targets);
  if (!spec.targets.empty() && !root["array"]) {
    w.Add("targets", "only used with array (each element picks one of the targets)");
  }
  if (!spec.array.target_by.empty() && spec.targets.empty()) {
    w.Add("array.target_by", "only used with targets");
  }
  if (const YAML::Node o = root["overrides"]; o && !o.IsNull()) ParseOverrides(w, o, &spec);
  return spec;
}

Result<JobSpec> LoadJobSpec(const std::string& path, std::vector<Problem>* problems) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status().WithContext("the job spec");
  return ParseJobSpec(*text, problems);
}

Result<std::pair<int, int>> ParseNnodesText(std::string_view text) {
  const std::vector<std::string> parts = Split(text, ':', /*skip_empty=*/false);
  const std::optional<int64_t> lo = ParseInt64(parts[0]);
  const std::optional<int64_t> hi = parts.size() == 2 ? ParseInt64(parts[1]) : lo;
  if (parts.size() > 2 || !lo || !hi) {
    return InvalidArgument("'{}' is not N or MIN:MAX (e.g. 2 or 1:4)", text);
  }
  if (*lo < 1 || *hi < *lo || *hi > 100000) {
    return InvalidArgument("'{}' needs 1 <= MIN <= MAX", text);
  }
  return std::pair<int, int>(static_cast<int>(*lo), static_cast<int>(*hi));
}

void ResolveEntrypointPath(JobSpec* spec, const std::string& base_dir) {
  namespace fs = std::filesystem;
  const std::string& e = spec->entrypoint;
  if (spec->module || e.empty() || base_dir.empty() || fs::path(e).is_absolute()) return;
  if (!EndsWith(e, ".py") && e.find('/') == std::string::npos) return;  // a program on PATH
  std::error_code ec;
  const fs::path p = fs::path(base_dir) / e;
  if (fs::is_regular_file(p, ec)) spec->entrypoint = fs::absolute(p, ec).lexically_normal().string();
}

void CheckHostPathVolumes(const JobSpec& spec, const std::string& runner,
                          std::vector<Problem>* problems) {
  for (size_t i = 0; i < spec.volumes.size(); ++i) {
    if (spec.volumes[i].host_path.empty()) {
      problems->push_back({fmt::format("volumes[{}]", i),
                           fmt::format("{} uses host_path volumes only (a path mounted on every node); "
                                       "claim and nfs need kubernetes",
                                       runner)});
    }
  }
  for (size_t i = 0; i < spec.mounts.size(); ++i) {
    const Mount& m = spec.mounts[i];
    for (const Volume& v : spec.volumes) {
      if (v.name == m.volume && !v.host_path.empty() && v.host_path != m.path) {
        problems->push_back(
            {fmt::format("mounts[{}].path", i),
             fmt::format("{} runs without containers, so volume '{}' is seen at its host path "
                         "{}; set path: {}",
                         runner, m.volume, v.host_path, v.host_path)});
      }
    }
  }
}

std::vector<std::string> ExpandArgs(const std::vector<std::string>& args,
                                    const std::map<std::string, std::string>& vars) {
  auto is_name_char = [](char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  // The variable reference starting at a[p] == '$': (name, length) or ("", 0).
  auto reference = [&](const std::string& a, size_t p) -> std::pair<std::string, size_t> {
    size_t q = p + 1;
    if (q < a.size() && a[q] == '{') {
      size_t close = a.find('}', q);
      if (close == std::string::npos) return {"", 0};
      return {a.substr(q + 1, close - q - 1), close + 1 - p};
    }
    std::string name;
    while (q < a.size() && is_name_char(a[q], q == p + 1)) name += a[q++];
    return {name, q - p};
  };
  std::vector<std::string> out;
  out.reserve(args.size());
  for (const std::string& a : args) {
    std::string result;
    for (size_t p = 0; p < a.size();) {
      if (a[p] != '$') {
        result += a[p++];
        continue;
      }
      // $$NAME with NAME a job variable: the text $NAME. Any other $$ stays (a shell's pid).
      if (p + 1 < a.size() && a[p + 1] == '$') {
        auto [name, len] = reference(a, p + 1);
        if (len > 0 && vars.count(name)) {
          result += a.substr(p + 1, len);
          p += 1 + len;
        } else {
          result += "$$";
          p += 2;
        }
        continue;
      }
      auto [name, len] = reference(a, p);
      auto it = len > 0 ? vars.find(name) : vars.end();
      if (it == vars.end()) {  // not a job variable: left for the program (or its shell)
        result += '$';
        ++p;
        continue;
      }
      result += it->second;
      p += len;
    }
    out.push_back(std::move(result));
  }
  return out;
}

std::vector<std::string> ElementArgs(const JobSpec& spec,
                                     const std::map<std::string, std::string>* element_env) {
  std::map<std::string, std::string> vars = spec.env;
  if (element_env) {
    for (const auto& [k, v] : *element_env) vars[k] = v;
  }
  return ExpandArgs(spec.args, vars);
}

void CheckUnsupportedFields(const JobSpec& spec, const std::string& backend,
                            std::vector<Problem>* problems) {
  const std::string& runner = backend;
  const bool extended_ok = backend != "local";        // Slurm: gres; Kubernetes: limits
  const bool placement_ok = backend == "kubernetes" || backend == "k8s";  // node labels: Kubernetes
  if (!extended_ok && !spec.resources.extended.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, count] : spec.resources.extended) names.push_back(name);
    problems->push_back(
        {"resources.extended",
         fmt::format("the {} backend cannot reserve {} (it has no extended resources); run "
                     "the job on kubernetes or slurm, or remove the field",
                     runner, fmt::join(names, ", "))});
  }
  if (!placement_ok && !spec.placement.node_selector.empty()) {
    problems->push_back(
        {"placement.node_selector",
         fmt::format("the {} backend cannot choose nodes by label; run the job on kubernetes, "
                     "or remove the field",
                     runner)});
  }
}

std::string FormatProblems(const std::vector<Problem>& problems) {
  std::string out;
  for (const auto& p : problems) out += "  " + p.ToString() + "\n";
  return out;
}

}  // namespace cohort::launch
