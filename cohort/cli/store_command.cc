// Implements `cohort store`: serves until SIGINT/SIGTERM. The token comes from
// COHORT_TOKEN (or --token-file) and is never printed.
#include "cohort/cli/store_command.h"

#include <CLI/CLI.hpp>

#include "cohort/base/exit_codes.h"
#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/cli/cli_util.h"
#include "cohort/store/store_server.h"

namespace cohort::cli {

int StoreCommand(const std::vector<std::string>& args) {
  CLI::App app("Serve the cohort rendezvous store.", "cohort store");
  std::string host = "0.0.0.0";
  int port = 29400;
  std::string token_file;
  app.add_option("--host", host, "address to listen on");
  app.add_option("--port", port, "port to listen on (0 = any free port)");
  app.add_option("--token-file", token_file,
                 "file holding the job token (default: the COHORT_TOKEN variable)");
  if (int rc = ParseCommandLine(app, args, "store"); rc >= 0) return rc;
  std::string token;
  if (!token_file.empty()) {
    auto read = ReadTokenFile(token_file);
    if (!read.ok()) {
      fmt::print(stderr, "cohort store: {}\n", read.status().message());
      return kExitInvalidValue;
    }
    token = *read;
  } else {
    token = worker_env::Inherited(worker_env::kToken).value_or("");
  }
  if (token.empty()) {
    fmt::print(stderr,
               "cohort store: no job token: set COHORT_TOKEN (the same value on every node) or "
               "pass --token-file\n");
    return kExitInvalidValue;
  }
  auto server = store::StoreServer::Start({.host = host, .port = port, .token = token});
  if (!server.ok()) {
    bool in_use = server.status().code() == StatusCode::kAlreadyExists;
    fmt::print(stderr, "cohort store: {}\n", server.status().message());
    return in_use ? kExitPortInUse : kExitInvalidValue;
  }
  fmt::print("cohort store listening on {}:{}\n", host, (*server)->port());
  std::fflush(stdout);
  WaitForStopSignal();  // main.cc blocked them before any thread started
  (*server)->Stop();
  return 0;
}

}  // namespace cohort::cli
