// /proc and NVML sampling (see system.h). Thread-safety: one thread at a time.
#include "cohort/metrics/system.h"
#include "cohort/base/file.h"
#include "cohort/base/settings.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace cohort::metrics {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Why a /proc file gave no sample: the read's error, or a format this code does not know.
std::string Why(const Result<std::string>& read, const std::string& path) {
  return read.ok() ? fmt::format("cannot read {}: unexpected contents", path)
                   : read.status().message();
}

// Sets the gauge `name` to the number `field` of `sample` when the sample has that field.
void SetFromSample(Registry& registry, const nlohmann::json& sample, const char* field,
                   std::string_view name, std::string_view help, const Labels& labels = {}) {
  if (sample.contains(field)) {
    registry.GetGauge(name, help, labels).Set(sample.at(field).get<double>());
  }
}

}  // namespace

// NVML through dlopen: only the handful of entry points used, declared from the C ABI.
struct SystemSampler::Nvml {
  using Ret = int;  // nvmlReturn_t; 0 = success
  using Device = void*;
  struct Utilization {
    unsigned int gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  void* lib = nullptr;
  bool ok = false;
  std::string reason;
  Ret (*init)() = nullptr;
  Ret (*shutdown)() = nullptr;
  Ret (*count)(unsigned int*) = nullptr;
  Ret (*handle)(unsigned int, Device*) = nullptr;
  Ret (*util)(Device, Utilization*) = nullptr;
  Ret (*memory)(Device, Memory*) = nullptr;
  Ret (*name)(Device, char*, unsigned int) = nullptr;

  Nvml() {
    const std::string& path = settings::kNvmlLibrary.Get();
    lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* err = ::dlerror();
      reason = fmt::format("NVML not loaded ({}): no NVIDIA driver on this machine",
                           err ? err : path);
      return;
    }
    auto sym = [&](const char* n) { return ::dlsym(lib, n); };
    init = reinterpret_cast<Ret (*)()>(sym("nvmlInit_v2"));
    shutdown = reinterpret_cast<Ret (*)()>(sym("nvmlShutdown"));
    count = reinterpret_cast<Ret (*)(unsigned int*)>(sym("nvmlDeviceGetCount_v2"));
    handle = reinterpret_cast<Ret (*)(unsigned int, Device*)>(sym("nvmlDeviceGetHandleByIndex_v2"));
    util = reinterpret_cast<Ret (*)(Device, Utilization*)>(sym("nvmlDeviceGetUtilizationRates"));
    memory = reinterpret_cast<Ret (*)(Device, Memory*)>(sym("nvmlDeviceGetMemoryInfo"));
    name = reinterpret_cast<Ret (*)(Device, char*, unsigned int)>(sym("nvmlDeviceGetName"));
    if (!init || !shutdown || !count || !handle || !util || !memory) {
      reason = fmt::format("{} lacks the NVML entry points cohort uses", path);
      return;
    }
    Ret rc = init();
    if (rc != 0) {
      reason = fmt::format("nvmlInit failed (NVML error {})", rc);
      return;
    }
    ok = true;
  }
  ~Nvml() {
    if (ok) shutdown();
    if (lib) ::dlclose(lib);
  }
};

SystemSampler::SystemSampler() = default;
SystemSampler::~SystemSampler() = default;

nlohmann::json SystemSampler::SampleWorker(const WorkerProcess& w, double now) {
  nlohmann::json out = {{"rank", w.rank}, {"local_rank", w.local_rank}, {"pid", w.pid}};
  const std::string base = fmt::format("{}/{}", proc_, w.pid);
  const auto stat = ReadFileToString(base + "/stat");
  if (!stat.ok() || stat->rfind(')') == std::string::npos) {
    out["error"] = Why(stat, base + "/stat");
    return out;
  }
  std::istringstream rest(stat->substr(stat->rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  const double ticks = utime + stime, hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  auto it = worker_marks_.find(w.pid);
  if (it != worker_marks_.end() && now > it->second.time) {
    out["cpu_percent"] = 100.0 * (ticks - it->second.ticks) / hz / (now - it->second.time);
  }
  worker_marks_[w.pid] = {ticks, now};
  if (const auto status = ReadFileToString(base + "/status"); status.ok()) {
    auto at = status->find("VmRSS:");
    if (at != std::string::npos) out["rss_bytes"] = std::atoll(status->c_str() + at + 6) * 1024;
  }
  if (const auto io = ReadFileToString(base + "/io"); io.ok()) {
    auto rchar = io->find("rchar:"), wchar = io->find("wchar:");
    if (rchar != std::string::npos) out["read_bytes"] = std::atoll(io->c_str() + rchar + 6);
    if (wchar != std::string::npos) out["write_bytes"] = std::atoll(io->c_str() + wchar + 6);
  } else {
    out["io_error"] = Why(io, base + "/io");
  }
  return out;
}

nlohmann::json SystemSampler::SampleNode(double now) {
  nlohmann::json out = nlohmann::json::object();
  const auto stat = ReadFileToString(proc_ + "/stat");
  if (stat.ok() && stat->rfind("cpu ", 0) == 0) {
    std::istringstream line(stat->substr(4, stat->find('\n') - 4));
    double v, total = 0, idle = 0;
    for (int i = 0; line >> v; ++i) {
      total += v;
      if (i == 3 || i == 4) idle += v;  // idle, iowait
    }
    const double busy = total - idle;
    if (node_total_.time > 0 && total > node_total_.ticks) {
      out["cpu_percent"] = 100.0 * (busy - node_busy_.ticks) / (total - node_total_.ticks);
    }
    node_busy_ = {busy, now};
    node_total_ = {total, now};
  } else {
    out["cpu_error"] = Why(stat, proc_ + "/stat");
  }
  const auto mem = ReadFileToString(proc_ + "/meminfo");
  if (mem.ok()) {
    auto value = [&](const char* key) -> int64_t {
      auto at = mem->find(key);
      return at == std::string::npos ? 0 : std::atoll(mem->c_str() + at + std::strlen(key)) * 1024;
    };
    out["mem_total_bytes"] = value("MemTotal:");
    out["mem_used_bytes"] = value("MemTotal:") - value("MemAvailable:");
  } else {
    out["mem_error"] = Why(mem, proc_ + "/meminfo");
  }
  if (const auto net = ReadFileToString(proc_ + "/net/dev"); net.ok()) {
    std::istringstream lines(*net);
    std::string line;
    int64_t rx = 0, tx = 0;
    while (std::getline(lines, line)) {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string iface(line.substr(0, colon));
      iface.erase(0, iface.find_first_not_of(' '));
      if (iface == "lo") continue;
      std::istringstream f(line.substr(colon + 1));
      int64_t v[16] = {0};
      for (int i = 0; i < 16 && f >> v[i]; ++i) {
      }
      rx += v[0];
      tx += v[8];
    }
    out["net_rx_bytes"] = rx;
    out["net_tx_bytes"] = tx;
  } else {
    out["net_error"] = Why(net, proc_ + "/net/dev");
  }
  return out;
}

nlohmann::json SystemSampler::SampleGpus() {
  if (!nvml_) nvml_ = std::make_unique<Nvml>();
  nlohmann::json out = {{"available", nvml_->ok}};
  if (!nvml_->ok) {
    out["reason"] = nvml_->reason;
    out["devices"] = nlohmann::json::array();
    return out;
  }
  unsigned int n = 0;
  nvml_->count(&n);
  nlohmann::json devices = nlohmann::json::array();
  for (unsigned int i = 0; i < n; ++i) {
    Nvml::Device d = nullptr;
    if (nvml_->handle(i, &d) != 0) continue;
    nlohmann::json dev = {{"index", i}};
    Nvml::Utilization u{};
    if (nvml_->util(d, &u) == 0) dev["utilization_percent"] = u.gpu;
    Nvml::Memory m{};
    if (nvml_->memory(d, &m) == 0) {
      dev["memory_used_bytes"] = m.used;
      dev["memory_total_bytes"] = m.total;
    }
    char name[96] = {0};
    if (nvml_->name && nvml_->name(d, name, sizeof(name)) == 0) dev["name"] = name;
    devices.push_back(std::move(dev));
  }
  out["devices"] = devices;
  return out;
}

nlohmann::json SystemSampler::Sample(const std::vector<WorkerProcess>& workers,
                                     Registry& registry) {
  const double now = Now();
  nlohmann::json ws = nlohmann::json::array();
  for (const auto& w : workers) {
    nlohmann::json s = SampleWorker(w, now);
    const Labels labels = {{"rank", std::to_string(w.rank)}};
    SetFromSample(registry, s, "cpu_percent", "cohort_worker_cpu_percent",
                  "CPU use of the worker process, percent of one core", labels);
    SetFromSample(registry, s, "rss_bytes", "cohort_worker_resident_bytes",
                  "Resident memory of the worker process", labels);
    if (s.contains("read_bytes")) {
      registry.GetGauge("cohort_worker_read_bytes", "Bytes the worker read through syscalls (files, sockets)", labels)
          .Set(s["read_bytes"].get<double>());
      registry.GetGauge("cohort_worker_written_bytes", "Bytes the worker wrote through syscalls (files, sockets)", labels)
          .Set(s.value("write_bytes", 0.0));
    }
    ws.push_back(std::move(s));
  }
  // Drop marks of processes no longer watched.
  for (auto it = worker_marks_.begin(); it != worker_marks_.end();) {
    bool watched = false;
    for (const auto& w : workers) watched = watched || w.pid == it->first;
    it = watched ? std::next(it) : worker_marks_.erase(it);
  }
  nlohmann::json node = SampleNode(now);
  SetFromSample(registry, node, "cpu_percent", "cohort_node_cpu_percent",
                "CPU use of the node, percent of all cores");
  SetFromSample(registry, node, "mem_used_bytes", "cohort_node_memory_used_bytes",
                "Memory in use on the node");
  if (node.contains("net_rx_bytes")) {
    registry.GetGauge("cohort_node_network_received_bytes", "Bytes received on non-loopback interfaces")
        .Set(node["net_rx_bytes"].get<double>());
    registry.GetGauge("cohort_node_network_sent_bytes", "Bytes sent on non-loopback interfaces")
        .Set(node["net_tx_bytes"].get<double>());
  }
  nlohmann::json gpus = SampleGpus();
  registry.GetGauge("cohort_gpu_monitoring_available", "1 when NVML is loaded and initialised")
      .Set(gpus["available"].get<bool>() ? 1 : 0);
  for (const auto& d : gpus["devices"]) {
    const Labels labels = {{"gpu", std::to_string(d.value("index", 0))}};
    SetFromSample(registry, d, "utilization_percent", "cohort_gpu_utilization_percent",
                  "GPU utilisation (NVML)", labels);
    SetFromSample(registry, d, "memory_used_bytes", "cohort_gpu_memory_used_bytes",
                  "GPU memory in use (NVML)", labels);
  }
  return {{"workers", ws}, {"node", node}, {"gpus", gpus}};
}

}  // namespace cohort::metrics
