// Subcommand helpers (see cli_util.h). Thread-safety: main thread only.
#include "cohort/cli/cli_util.h"
#include "cohort/base/exit_codes.h"

#include <fmt/format.h>

#include <ctime>


namespace cohort::cli {

int ParseCommandLine(CLI::App& app, const std::vector<std::string>& args,
                     const std::string& command) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "cohort {}: {}; see 'cohort {} --help'\n", command, e.what(), command);
    return kExitUsage;
  }
  return -1;
}

std::string FormatTime(double unix_seconds) {
  if (unix_seconds <= 0) return "-";
  std::time_t s = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::localtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace cohort::cli
