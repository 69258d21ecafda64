// The settings registry and the declarations of every COHORT_* knob (see settings.h).
// Thread-safety: as there.
#include "cohort/base/settings.h"

#include <algorithm>
#include <cstdlib>

#include "cohort/base/log.h"

namespace cohort {
namespace {

std::vector<const SettingBase*>& Registry() {
  static auto* all = new std::vector<const SettingBase*>();  // lives until exit
  return *all;
}

}  // namespace

SettingBase::SettingBase(const char* name, const char* help) : name_(name), help_(help) {
  Registry().push_back(this);
}

std::optional<std::string> SettingBase::Raw() const { return SystemEnv(name_); }

void SettingBase::WarnMalformed(const std::string& raw) const {
  COHORT_LOG_WARN("settings", "ignoring {}={:?}: not a valid value; using the default", name_,
                  raw);
}

std::optional<std::string> SystemEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::vector<SettingInfo> AllSettings() {
  std::vector<SettingInfo> out;
  for (const SettingBase* s : Registry()) out.push_back(s->Describe());
  std::sort(out.begin(), out.end(),
            [](const SettingInfo& a, const SettingInfo& b) { return a.name < b.name; });
  return out;
}

std::string SettingsTable(bool markdown) {
  std::string out;
  if (markdown) {
    out += "| setting | type | default | meaning |\n|---|---|---|---|\n";
    for (const SettingInfo& s : AllSettings()) {
      out += fmt::format("| `{}` | {} | {} | {} |\n", s.name, s.type,
                         s.default_text.empty() ? "(empty)" : "`" + s.default_text + "`", s.help);
    }
    return out;
  }
  for (const SettingInfo& s : AllSettings()) {
    out += fmt::format("{:<28} {:<24} {:<8} {}\n", s.name,
                       s.value_text.empty() ? "(empty)" : s.value_text,
                       s.from_environment ? "env" : "default", s.help);
  }
  return out;
}

namespace settings {

const Setting<std::string> kLogLevel{
    "COHORT_LOG_LEVEL", "info", "log level: trace, debug, info, warn, error or off"};
const Setting<std::string> kTransport{
    "COHORT_TRANSPORT", "auto",
    "collectives between ranks of one host: auto (shared memory), shm or tcp"};
const Setting<std::string> kAlgo{
    "COHORT_ALGO", "",
    "force one allreduce algorithm: ring, rd, rabenseifner, shm_direct, shm_rs or hier "
    "(empty: chosen by size, docs/collectives.md)"};
const Setting<int64_t> kShmSlotBytes{
    "COHORT_SHM_SLOT_BYTES", 256 << 10, "shared-memory chunk size of the collectives, bytes"};
const Setting<double> kCommTimeout{
    "COHORT_COMM_TIMEOUT", 300,
    "seconds a collective may wait for its peers before it fails naming them"};
const Setting<std::string> kHostId{
    "COHORT_HOST_ID", "",
    "which ranks share a host (empty: host name and boot id); ranks with the same value use "
    "shared memory"};
const Setting<std::string> kReduceKernel{
    "COHORT_REDUCE_KERNEL", "",
    "force the reduction kernel: avx512, avx2 or generic (empty: the best the CPU has)"};
const Setting<std::string> kNvmlLibrary{
    "COHORT_NVML_LIBRARY", "libnvidia-ml.so.1", "the NVML library GPU metrics are read with"};
const Setting<std::string> kPython{
    "COHORT_PYTHON", "python3", "the interpreter `cohort run script.py` starts workers with"};
const Setting<bool> kTorchStoreAnyHost{
    "COHORT_TORCH_STORE_ANY_HOST", false,
    "let every host reach the workers' torch store (MASTER_PORT), not only the round's nodes "
    "at the addresses they published (for nodes that reach MASTER_ADDR from another address)"};
const Setting<bool> kLiveReconfig{
    "COHORT_LIVE_RECONFIG", true,
    "keep the workers through a node loss or join when they can re-form in place (cohort "
    "run across nodes; 0: restart the worker group as torchrun does)"};
const Setting<double> kReconfigTimeout{
    "COHORT_RECONFIG_TIMEOUT", 60,
    "seconds workers may take to re-form in a new membership before the agent restarts them"};
const Setting<double> kEtcdRetryBudget{
    "COHORT_ETCD_RETRY_BUDGET", 0.2,
    "retries an etcd client may send, as a share of its first tries (a token bucket that "
    "also refills by 0.5 a second); a retry past it waits: a slow etcd is not pushed into "
    "a retry storm (0: no budget)"};
const Setting<std::string> kHome{
    "COHORT_HOME", "",
    "job history, pipeline runs and local job logs (empty: ~/.cohort; --home overrides)"};
const Setting<std::string> kTensorboardDir{
    "COHORT_TENSORBOARD_DIR", "",
    "where rank 0 of a PyTorch script writes the TensorBoard scalars cohort_torch.report() "
    "records (train/loss, train/samples_per_second); empty: none"};
const Setting<int64_t> kTrainFaultRank{
    "COHORT_TRAIN_FAULT_RANK", -1,
    "cohort-train: this rank kills itself (SIGKILL) at COHORT_TRAIN_FAULT_STEP of its first "
    "attempt (tests, demos)"};
const Setting<int64_t> kTrainFaultStep{
    "COHORT_TRAIN_FAULT_STEP", -1, "cohort-train: the step of the injected fault"};
const Setting<int64_t> kTrainFaultWriteStep{
    "COHORT_TRAIN_FAULT_WRITE_STEP", -1,
    "cohort-train: rank 0 kills itself (SIGKILL) half-way through writing the checkpoint "
    "file of this step (or the first written after it) in its first attempt (tests, demos)"};

}  // namespace settings
}  // namespace cohort
