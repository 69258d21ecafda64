// Helpers shared by the cohort subcommands. Thread-safety: main thread only.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/exit_codes.h"
#include "cohort/base/status.h"

namespace cohort::cli {

// Parses the words after "cohort <command>" into `app` (CLI11 wants them reversed). Prints
// the help, or the error with a pointer to `cohort <command> --help`. Returns -1 to go on,
// else the exit code: 0 after --help, `bad_value_code` for a value that does not convert
// or validate, kExitUsage after any other error.
int ParseCommandLine(CLI::App& app, const std::vector<std::string>& args,
                     const std::string& command, int bad_value_code = kExitUsage);

// Prints "cohort <command>: <message of s>" on stderr; returns `code`.
int CommandFailed(std::string_view command, const Status& s, int code);

// What `--print-config` prints: every option of `app` after parsing `given` (the words the
// user typed) with its value and where it came from (flag, env NAME, default), then every
// COHORT_* setting (base/settings.h) with its value and source.
std::string ConfigReport(const CLI::App& app, const std::vector<std::string>& given);

// A signalfd (non-blocking, close-on-exec) for SIGINT, SIGTERM and SIGHUP, which main.cc
// already blocks in every thread: a command that runs children polls it to stop them
// cleanly on Ctrl-C. -1 when it cannot be made.
int SignalFd();

// For a server command that runs until Ctrl-C or SIGTERM: blocks SIGINT and SIGTERM in this
// thread before the server's threads start (they inherit the mask, so only the wait below
// receives them), and waits for one (returns it).
void BlockStopSignals();
int WaitForStopSignal();

// The token in the first line of `path`, trimmed (the file is the user's; the token is never
// printed). kInvalidArgument naming the file when it cannot be read.
Result<std::string> ReadTokenFile(const std::string& path);

// "2026-11-29 16:23:05" in local time (or as `format` says, strftime); "-" for 0 (not yet).
std::string FormatTime(double unix_seconds, const char* format = "%Y-%m-%d %H:%M:%S");

}  // namespace cohort::cli
