// `cohort ui [--host 127.0.0.1] [--port P] [--token-file F]`: serves the pages until SIGINT
// or SIGTERM (cohort/ui/ui_server.h). The token (needed beyond loopback) comes from
// --token-file or COHORT_UI_TOKEN and is never printed. Thread-safety: main thread only.
#include "cohort/cli/ui_command.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cohort/base/exit_codes.h"
#include "cohort/cli/cli_util.h"
#include "cohort/cli/exec_sibling.h"
#include "cohort/launch/local_backend.h"
#include "cohort/ui/ui_server.h"

namespace cohort::cli {

int UiCommand(const std::vector<std::string>& args) {
  CLI::App app("Web pages over the job and pipeline histories: jobs, array elements, "
               "pipeline DAGs, logs, curves; cancel, resubmit, resume.",
               "cohort ui");
  ui::UiOptions o;
  o.home = launch::DefaultCohortHome();
  std::string token_file;
  app.add_option("--home", o.home, "job history and local logs (default $COHORT_HOME or ~/.cohort)");
  app.add_option("--host", o.host, "address to listen on (default 127.0.0.1; any other "
                 "needs a token)");
  app.add_option("--port", o.port, "port (default 0: any free one, printed)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--token-file", token_file,
                 "file holding the token pages need beyond loopback (default: COHORT_UI_TOKEN)");
  app.add_option("--token", o.token)->envname("COHORT_UI_TOKEN")->group("");  // env only
  if (int rc = ParseCommandLine(app, args, "ui"); rc >= 0) return rc;
  if (!token_file.empty()) {
    auto read = ReadTokenFile(token_file);
    if (!read.ok() || read->empty()) {
      fmt::print(stderr, "cohort ui: cannot read a token from {} (one line, not empty)\n",
                 token_file);
      return kExitInvalidValue;
    }
    o.token = *read;
  }
  o.cohort_bin = SiblingPath("cohort");
  BlockStopSignals();
  auto server = ui::UiServer::Start(o);
  if (!server.ok()) {
    fmt::print(stderr, "cohort ui: {}\n", server.status().message());
    return server.status().code() == StatusCode::kAlreadyExists ? kExitPortInUse
                                                                 : kExitInvalidValue;
  }
  const bool v6 = o.host.find(':') != std::string::npos;
  fmt::print("cohort ui on http://{}{}{}:{}/ (history: {})\n", v6 ? "[" : "", o.host,
             v6 ? "]" : "", (*server)->port(), o.home);
  std::fflush(stdout);
  WaitForStopSignal();
  (*server)->Stop();
  return kExitOk;
}

}  // namespace cohort::cli
