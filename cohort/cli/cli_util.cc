// Subcommand helpers (see cli_util.h). Thread-safety: main thread only.
#include "cohort/cli/cli_util.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <ctime>
#include <fstream>

#include "cohort/base/exit_codes.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"

namespace cohort::cli {

int ParseCommandLine(CLI::App& app, const std::vector<std::string>& args,
                     const std::string& command, int bad_value_code) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    const bool bad_value = dynamic_cast<const CLI::ConversionError*>(&e) != nullptr ||
                           dynamic_cast<const CLI::ValidationError*>(&e) != nullptr;
    fmt::print(stderr, "cohort {}: {}; see 'cohort {} --help'\n", command, e.what(), command);
    return bad_value ? bad_value_code : kExitUsage;
  }
  return -1;
}

int CommandFailed(std::string_view command, const Status& s, int code) {
  fmt::print(stderr, "cohort {}: {}\n", command, s.message());
  return code;
}

std::string ConfigReport(const CLI::App& app, const std::vector<std::string>& given) {
  auto typed = [&](const CLI::Option* o) {
    for (const std::string& name : o->get_lnames()) {
      for (const std::string& word : given) {
        if (word == "--" + name || StartsWith(word, "--" + name + "=")) return true;
      }
    }
    return false;
  };
  std::string out = "flags (flag > environment > default):\n";
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_lnames().empty() || o->get_lnames()[0] == "help") continue;
    std::string value;
    for (const std::string& r : o->results()) value += (value.empty() ? "" : ",") + r;
    if (o->results().empty()) value = o->get_default_str();
    std::string source = "default";
    if (typed(o)) {
      source = "flag";
    } else if (!o->get_envname().empty() && SystemEnv(o->get_envname().c_str())) {
      source = "env " + o->get_envname();
    }
    out += fmt::format("  --{:<24} {:<22} {}\n", o->get_lnames()[0],
                       value.empty() ? "(empty)" : value, source);
  }
  out += "settings (environment > default; docs/settings.md):\n";
  for (const std::string& line : Split(SettingsTable(false), '\n')) out += "  " + line + "\n";
  return out;
}

std::string FormatTime(double unix_seconds, const char* format) {
  if (unix_seconds <= 0) return "-";
  std::time_t s = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::localtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

int SignalFd() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  return ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

namespace {
sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void BlockStopSignals() {
  const sigset_t set = StopSignals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForStopSignal() {
  const sigset_t set = StopSignals();
  const int sfd = ::signalfd(-1, &set, SFD_CLOEXEC);
  signalfd_siginfo si{};
  while (sfd >= 0 && ::read(sfd, &si, sizeof(si)) != sizeof(si)) {
  }
  if (sfd >= 0) ::close(sfd);
  return static_cast<int>(si.ssi_signo);
}

Result<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token)) {
    return InvalidArgument("cannot read the token from {}", path);
  }
  return std::string(Trim(token));
}

}  // namespace cohort::cli
