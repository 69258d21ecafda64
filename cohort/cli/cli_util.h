// Helpers shared by the cohort subcommands. Thread-safety: main thread only.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace cohort::cli {

// Parses the words after "cohort <command>" into `app` (CLI11 wants them reversed). Prints
// the help, or the error with a pointer to `cohort <command> --help`. Returns -1 to go on,
// else the exit code (0 after --help, kExitUsage after an error).
int ParseCommandLine(CLI::App& app, const std::vector<std::string>& args,
                     const std::string& command);

// What `--print-config` prints: every option of `app` after parsing `given` (the words the
// user typed) with its value and where it came from (flag, env NAME, default), then every
// COHORT_* setting (base/settings.h) with its value and source.
std::string ConfigReport(const CLI::App& app, const std::vector<std::string>& given);

// "2026-11-29 16:23:05" in local time; "-" for 0 (not yet).
std::string FormatTime(double unix_seconds);

}  // namespace cohort::cli
