// Logging by subsystem on spdlog. Each subsystem ("store", "rdzv", "agent", ...) has a
// named logger; all share one stderr sink and the level from COHORT_LOG_LEVEL
// (trace|debug|info|warn|error|off, default info).
//
//   COHORT_LOG_INFO("store", "listening on {}:{}", host, port);
//
// Secrets (tokens, passwords) are never passed to the logger.
// Thread-safety: loggers are thread-safe (spdlog's _mt sinks).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>

namespace cohort::log {

// Returns the logger of `subsystem`, creating it on first use.
std::shared_ptr<spdlog::logger> Get(std::string_view subsystem);
// Applies COHORT_LOG_LEVEL (or `level` when not empty) to every logger.
void SetLevel(std::string_view level);

}  // namespace cohort::log

#define COHORT_LOG_TRACE(sub, ...) ::cohort::log::Get(sub)->trace(__VA_ARGS__)
#define COHORT_LOG_DEBUG(sub, ...) ::cohort::log::Get(sub)->debug(__VA_ARGS__)
#define COHORT_LOG_INFO(sub, ...) ::cohort::log::Get(sub)->info(__VA_ARGS__)
#define COHORT_LOG_WARN(sub, ...) ::cohort::log::Get(sub)->warn(__VA_ARGS__)
#define COHORT_LOG_ERROR(sub, ...) ::cohort::log::Get(sub)->error(__VA_ARGS__)
