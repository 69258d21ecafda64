// Implements subsystem loggers. Thread-safe: Registry::mu guards the logger map and the
// level (creation and SetLevel are serialized by it); the sink is set once at construction;
// spdlog loggers themselves are thread-safe.
#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/base/settings.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <map>

namespace cohort::log {
namespace {

struct Registry {
  Mutex mu;
  const std::shared_ptr<spdlog::sinks::stderr_sink_mt> sink =
      std::make_shared<spdlog::sinks::stderr_sink_mt>();
  std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers
      COHORT_GUARDED_BY(mu);
  spdlog::level::level_enum level COHORT_GUARDED_BY(mu) = spdlog::level::info;
  bool level_from_env COHORT_GUARDED_BY(mu) = false;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: used at exit
  return *registry;
}

spdlog::level::level_enum ParseLevel(std::string_view text) {
  auto level = spdlog::level::from_str(std::string(text));
  if (level == spdlog::level::off && text != "off") return spdlog::level::info;
  return level;
}

}  // namespace

std::shared_ptr<spdlog::logger> Get(std::string_view subsystem) {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  if (!r.level_from_env) {
    r.level_from_env = true;
    r.level = ParseLevel(settings::kLogLevel.Get());
  }
  auto it = r.loggers.find(subsystem);
  if (it != r.loggers.end()) return it->second;
  auto logger = std::make_shared<spdlog::logger>(std::string(subsystem), r.sink);
  logger->set_pattern("[cohort %H:%M:%S.%e %^%l%$ %n] %v");
  logger->set_level(r.level);
  r.loggers.emplace(std::string(subsystem), logger);
  return logger;
}

void SetLevel(std::string_view level) {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  r.level_from_env = true;
  r.level = ParseLevel(level);
  for (auto& [name, logger] : r.loggers) logger->set_level(r.level);
}

}  // namespace cohort::log
