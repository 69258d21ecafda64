// Settings: every COHORT_* knob a user may set in the environment, declared once here with
// its type, default and a line of help, read once (the first Get) and listed with the value
// in force and where it came from (`cohort run --print-config`, docs/settings.md, which
// `cohort run --print-config --markdown` writes). NCCL's model: one declaration per
// parameter, typed, printable.
//
//   const int64_t slot = settings::kShmSlotBytes.Get();
//
// Not settings: the launcher's flags (their COHORT_* env fallbacks are CLI11's, flag > env >
// default), the variables cohort run hands its workers (base/worker_env.h, a contract), and
// the operating system's own (SystemEnv).
//
// A malformed value is reported once (a warning) and the default is used.
// Thread-safety: Get() is safe from any thread (the value is computed once); the registry
// is filled during static initialization and only read afterwards.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cohort/base/strings.h"

namespace cohort {

// One setting as `--print-config` shows it.
struct SettingInfo {
  std::string name;
  std::string type;           // int, float, bool, string
  std::string default_text;
  std::string value_text;     // the value in force
  bool from_environment = false;
  std::string help;
};

class SettingBase {
 public:
  SettingBase(const char* name, const char* help);
  virtual ~SettingBase() = default;
  const char* name() const { return name_; }
  const char* help() const { return help_; }
  virtual SettingInfo Describe() const = 0;

 protected:
  // The raw environment value, nullopt when unset or empty.
  std::optional<std::string> Raw() const;
  void WarnMalformed(const std::string& raw) const;

 private:
  const char* name_;
  const char* help_;
};

template <typename T>
class Setting final : public SettingBase {
 public:
  Setting(const char* name, T default_value, const char* help)
      : SettingBase(name, help), default_(std::move(default_value)) {}

  const T& Get() const {
    std::call_once(once_, [this] { value_ = Read(); });
    return value_;
  }
  const T& default_value() const { return default_; }

  SettingInfo Describe() const override {
    SettingInfo info{name(), TypeName(), Text(default_), Text(Get()), from_env_, help()};
    return info;
  }

 private:
  T Read() const {
    std::optional<std::string> raw = Raw();
    if (!raw) return default_;
    std::optional<T> parsed;
    if constexpr (std::is_same_v<T, std::string>) {
      parsed = *raw;
    } else if constexpr (std::is_same_v<T, bool>) {
      parsed = ParseBool(*raw);
    } else if constexpr (std::is_integral_v<T>) {
      auto v = ParseInt64(*raw);
      if (v) parsed = static_cast<T>(*v);
    } else {
      parsed = ParseDouble(*raw);
    }
    if (!parsed) {
      WarnMalformed(*raw);
      return default_;
    }
    from_env_ = true;
    return *parsed;
  }
  static const char* TypeName() {
    if constexpr (std::is_same_v<T, std::string>) return "string";
    if constexpr (std::is_same_v<T, bool>) return "bool";
    if constexpr (std::is_integral_v<T>) return "int";
    return "float";
  }
  static std::string Text(const T& v) {
    if constexpr (std::is_same_v<T, std::string>) return v;
    if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
    return fmt::format("{}", v);
  }

  T default_;
  mutable std::once_flag once_;
  mutable T value_{};
  mutable bool from_env_ = false;
};

// Every setting of the program, by name.
std::vector<SettingInfo> AllSettings();

// The table `--print-config` prints: NAME VALUE (env|default) — help; with `markdown`, the
// reference table of docs/settings.md (defaults, not the values in force).
std::string SettingsTable(bool markdown);

// A variable of the operating system's (PATH, HOME, TMPDIR, PYTHONPATH), read at each call;
// nullopt when unset or empty.
std::optional<std::string> SystemEnv(const char* name);

namespace settings {

// Logging.
extern const Setting<std::string> kLogLevel;
// Collectives (libcohort, in every worker).
extern const Setting<std::string> kTransport;
extern const Setting<std::string> kAlgo;
extern const Setting<int64_t> kShmSlotBytes;
extern const Setting<double> kCommTimeout;
extern const Setting<std::string> kHostId;
extern const Setting<std::string> kReduceKernel;
// Monitoring.
extern const Setting<std::string> kNvmlLibrary;
// The launcher and the job commands.
extern const Setting<std::string> kPython;
extern const Setting<bool> kTorchStoreAnyHost;
// Live reconfiguration (docs/multinode.md).
extern const Setting<bool> kLiveReconfig;
extern const Setting<double> kReconfigTimeout;
extern const Setting<double> kEtcdRetryBudget;
extern const Setting<std::string> kHome;
// cohort_torch.report (a PyTorch script's progress).
extern const Setting<std::string> kTensorboardDir;
// cohort-train's fault injection (tests and demos).
extern const Setting<int64_t> kTrainFaultRank;
extern const Setting<int64_t> kTrainFaultStep;
extern const Setting<int64_t> kTrainFaultWriteStep;

}  // namespace settings
}  // namespace cohort
