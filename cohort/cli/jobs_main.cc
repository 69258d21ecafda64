// cohort-jobs: the job and pipeline commands (`cohort submit | status | logs | cancel | list
// | pipeline` and the local runner `_run-local-job`), run by `cohort` through ExecSibling.
// A separate binary so the launcher (`cohort run`) does not load SQLite, PostgreSQL, YAML
// and CSV libraries it never uses. Thread-safety: main thread only.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cohort/cli/job_commands.h"
#include "cohort/base/exit_codes.h"
#include "cohort/cli/pipeline_command.h"
#include "cohort/cli/ui_command.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    fmt::print(stderr, "cohort-jobs: run it as `cohort <submit|status|logs|cancel|list|pipeline|ui>`\n");
    return cohort::kExitUsage;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "submit") return cohort::cli::SubmitCommand(args);
  if (command == "status") return cohort::cli::StatusCommand(args);
  if (command == "logs") return cohort::cli::LogsCommand(args);
  if (command == "cancel") return cohort::cli::CancelCommand(args);
  if (command == "list") return cohort::cli::ListCommand(args);
  if (command == "pipeline") return cohort::cli::PipelineCommand(args);
  if (command == "ui") return cohort::cli::UiCommand(args);
  if (command == "_run-local-job") return cohort::cli::RunLocalJobCommand(args);
  fmt::print(stderr, "cohort: unknown command '{}' (see `cohort --help`)\n", command);
  return cohort::kExitUsage;
}
