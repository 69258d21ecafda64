// JobSpec parsing and validation (see job_spec.h). Thread-safety: pure functions.
#include "cohort/launch/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/launch/spec_walker.h"

namespace cohort::launch {
namespace {

using Walker = SpecWalker;

bool IsDnsLabel(const std::string& s) {
  static const std::regex re("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  return s.size() <= 63 && std::regex_match(s, re);
}


void ParseResources(Walker& w, const YAML::Node& n, Resources* r) {
  const std::string path = "resources";
  if (!n.IsMap()) {
    w.Add(path, "must be a map (cpu, memory, gpu, network_devices)");
    return;
  }
  w.CheckKeys(n, path, {"cpu", "memory", "gpu", "network_devices"});
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
}

void ParseVolumes(Walker& w, const YAML::Node& n, std::vector<Volume>* out) {
  if (!n.IsSequence()) {
    w.Add("volumes", "must be a list of {name, host_path | claim | nfs}");
    return;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string path = fmt::format("volumes[{}]", i);
    const YAML::Node& v = n[i];
    if (!v.IsMap()) {
      w.Add(path, "must be a map {name, host_path | claim | nfs}");
      continue;
    }
    w.CheckKeys(v, path, {"name", "host_path", "claim", "nfs"});
    Volume vol;
    vol.name = w.String(v, path, "name").value_or("");
    if (vol.name.empty()) {
      w.Add(path + ".name", "required");
    } else if (!IsDnsLabel(vol.name)) {
      w.Add(path + ".name", fmt::format("'{}' must be lowercase letters, digits and '-'", vol.name));
    } else if (!names.insert(vol.name).second) {
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
    out->push_back(std::move(vol));
  }
}

void ParseMounts(Walker& w, const YAML::Node& n, const std::vector<Volume>& volumes,
                 std::vector<Mount>* out) {
  if (!n.IsSequence()) {
    w.Add("mounts", "must be a list of {volume, path, read_only}");
    return;
  }
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string path = fmt::format("mounts[{}]", i);
    const YAML::Node& m = n[i];
    if (!m.IsMap()) {
      w.Add(path, "must be a map {volume, path, read_only}");
      continue;
    }
    w.CheckKeys(m, path, {"volume", "path", "read_only"});
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
    out->push_back(std::move(mount));
  }
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
    w.CheckKeys(n, path, {"range", "manifest", "from_sql", "db", "concurrency"});
    a->range = w.String(n, path, "range").value_or("");
    a->manifest = w.String(n, path, "manifest").value_or("");
    a->from_sql = w.String(n, path, "from_sql").value_or("");
    a->db = w.String(n, path, "db").value_or("");
    if (auto c = w.Int(n, path, "concurrency", 1, 1000000)) a->concurrency = static_cast<int>(*c);
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
              {"name", "image", "entrypoint", "args", "nnodes", "nproc_per_node", "resources",
               "env", "volumes", "mounts", "max_restarts", "queue", "priority", "rdzv", "array"});

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
  if (spec.entrypoint.empty()) {
    w.Add("entrypoint", "required (the program every worker runs, e.g. python3 or ./train)");
  }
  spec.args = w.StringList(root, "", "args");

  if (auto nnodes = w.String(root, "", "nnodes")) {
    auto parts = Split(*nnodes, ':', /*skip_empty=*/false);
    auto lo = ParseInt64(parts[0]);
    auto hi = parts.size() == 2 ? ParseInt64(parts[1]) : lo;
    if (parts.size() > 2 || !lo || !hi) {
      w.Add("nnodes", fmt::format("'{}' is not N or MIN:MAX (e.g. 2 or 1:4)", *nnodes));
    } else if (*lo < 1 || *hi < *lo || *hi > 100000) {
      w.Add("nnodes", fmt::format("'{}' needs 1 <= MIN <= MAX", *nnodes));
    } else {
      spec.min_nodes = static_cast<int>(*lo);
      spec.max_nodes = static_cast<int>(*hi);
    }
  }
  if (auto n = w.Int(root, "", "nproc_per_node", 1, 4096)) spec.nproc_per_node = static_cast<int>(*n);
  if (YAML::Node r = root["resources"]) ParseResources(w, r, &spec.resources);

  if (YAML::Node env = root["env"]) {
    if (!env.IsMap()) {
      w.Add("env", "must be a map of NAME: value");
    } else {
      for (const auto& kv : env) {
        const std::string key = kv.first.Scalar();
        if (!IsEnvName(key)) {
          w.Add("env." + key, "is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
        } else if (!kv.second.IsScalar()) {
          w.Add("env." + key, "must be a single value");
        } else {
          spec.env[key] = kv.second.Scalar();
        }
      }
    }
  }
  if (YAML::Node v = root["volumes"]) ParseVolumes(w, v, &spec.volumes);
  if (YAML::Node m = root["mounts"]) ParseMounts(w, m, spec.volumes, &spec.mounts);
  if (auto r = w.Int(root, "", "max_restarts", 0, 1000000)) spec.max_restarts = static_cast<int>(*r);
  spec.queue = w.String(root, "", "queue").value_or("");
  spec.priority = w.String(root, "", "priority").value_or("");

  if (YAML::Node r = root["rdzv"]) {
    if (!r.IsMap()) {
      w.Add("rdzv", "must be a map {backend, endpoint, port}");
    } else {
      w.CheckKeys(r, "rdzv", {"backend", "endpoint", "port"});
      spec.rdzv.backend = w.String(r, "rdzv", "backend").value_or("c10d");
      if (spec.rdzv.backend == "static" || spec.rdzv.backend == "store") spec.rdzv.backend = "c10d";
      if (spec.rdzv.backend != "c10d" && spec.rdzv.backend != "etcd") {
        w.Add("rdzv.backend", fmt::format("'{}' is not c10d or etcd", spec.rdzv.backend));
      }
      spec.rdzv.endpoint = w.String(r, "rdzv", "endpoint").value_or("");
      if (auto p = w.Int(r, "rdzv", "port", 1, 65535)) spec.rdzv.port = static_cast<int>(*p);
      // An etcd backend without endpoint is up to the backend: kubernetes deploys one,
      // slurm refuses it (see their Validate).
    }
  }
  if (YAML::Node a = root["array"]) ParseArray(w, a, &spec.array);
  return spec;
}

Result<JobSpec> LoadJobSpec(const std::string& path, std::vector<Problem>* problems) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read the job spec {}: {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return ParseJobSpec(text.str(), problems);
}

std::string JobSpecToYaml(const JobSpec& s) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << s.name;
  if (!s.image.empty()) e << YAML::Key << "image" << YAML::Value << s.image;
  e << YAML::Key << "entrypoint" << YAML::Value << s.entrypoint;
  if (!s.args.empty()) e << YAML::Key << "args" << YAML::Value << YAML::Flow << s.args;
  e << YAML::Key << "nnodes" << YAML::Value << s.NnodesText();
  e << YAML::Key << "nproc_per_node" << YAML::Value << s.nproc_per_node;
  const Resources& r = s.resources;
  if (r.cpu > 0 || r.memory_bytes > 0 || r.gpu > 0 || !r.network_devices.empty()) {
    e << YAML::Key << "resources" << YAML::Value << YAML::BeginMap;
    if (r.cpu > 0) e << YAML::Key << "cpu" << YAML::Value << r.cpu;
    if (r.memory_bytes > 0) e << YAML::Key << "memory" << YAML::Value << r.memory_text;
    if (r.gpu > 0) e << YAML::Key << "gpu" << YAML::Value << r.gpu;
    if (!r.network_devices.empty()) {
      e << YAML::Key << "network_devices" << YAML::Value << YAML::Flow << r.network_devices;
    }
    e << YAML::EndMap;
  }
  if (!s.env.empty()) {
    e << YAML::Key << "env" << YAML::Value << YAML::BeginMap;
    for (const auto& [k, v] : s.env) e << YAML::Key << k << YAML::Value << v;
    e << YAML::EndMap;
  }
  if (!s.volumes.empty()) {
    e << YAML::Key << "volumes" << YAML::Value << YAML::BeginSeq;
    for (const auto& v : s.volumes) {
      e << YAML::BeginMap << YAML::Key << "name" << YAML::Value << v.name;
      if (!v.host_path.empty()) e << YAML::Key << "host_path" << YAML::Value << v.host_path;
      if (!v.claim.empty()) e << YAML::Key << "claim" << YAML::Value << v.claim;
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
  e << YAML::Key << "max_restarts" << YAML::Value << s.max_restarts;
  if (!s.queue.empty()) e << YAML::Key << "queue" << YAML::Value << s.queue;
  if (!s.priority.empty()) e << YAML::Key << "priority" << YAML::Value << s.priority;
  e << YAML::Key << "rdzv" << YAML::Value << YAML::BeginMap << YAML::Key << "backend"
    << YAML::Value << s.rdzv.backend;
  if (!s.rdzv.endpoint.empty()) e << YAML::Key << "endpoint" << YAML::Value << s.rdzv.endpoint;
  e << YAML::Key << "port" << YAML::Value << s.rdzv.port << YAML::EndMap;
  if (!s.array.empty()) {
    e << YAML::Key << "array" << YAML::Value << YAML::BeginMap;
    if (!s.array.range.empty()) e << YAML::Key << "range" << YAML::Value << s.array.range;
    if (!s.array.manifest.empty()) e << YAML::Key << "manifest" << YAML::Value << s.array.manifest;
    if (!s.array.from_sql.empty()) e << YAML::Key << "from_sql" << YAML::Value << s.array.from_sql;
    if (!s.array.db.empty()) e << YAML::Key << "db" << YAML::Value << s.array.db;
    if (s.array.concurrency > 0) {
      e << YAML::Key << "concurrency" << YAML::Value << s.array.concurrency;
    }
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
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

std::string FormatProblems(const std::vector<Problem>& problems) {
  std::string out;
  for (const auto& p : problems) out += "  " + p.ToString() + "\n";
  return out;
}

}  // namespace cohort::launch
