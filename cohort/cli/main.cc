// The `cohort` binary: dispatches to subcommands. Thread-safety: main thread only; signals
// the agent handles are blocked before any thread starts.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cohort/agent/agent.h"
#include "cohort/base/exit_codes.h"
#include "cohort/cli/scaling_command.h"
#include "cohort/cli/run_command.h"
#include "cohort/cli/store_command.h"
#include "cohort/cli/top_command.h"
#include "cohort/cli/exec_sibling.h"

namespace {

constexpr const char* kUsage =
    "cohort: elastic data-parallel training launcher\n"
    "\n"
    "Usage: cohort <command> [options]\n"
    "\n"
    "Commands:\n"
    "  run     launch workers on this node (torchrun-compatible flags)\n"
    "  store   serve the rendezvous store for multi-node jobs\n"
    "  top     the whole job in a terminal: every node and rank, restarts, logs\n"
    "  submit  submit a job spec (YAML) to a backend: local, slurm, kubernetes\n"
    "  status  a job's state; list recent jobs\n"
    "  logs    a job's log (--rank, --element, --follow)\n"
    "  cancel  cancel a job\n"
    "  list    recent jobs\n"
    "  pipeline  multi-step workflows: run, resume, status, list, export (Argo)\n"
    "  ui      web pages over the job and pipeline histories (jobs, arrays, DAGs, curves)\n"
    "  bench   nccl-tests-style collective benchmarks (runs cohort-bench);\n"
    "          bench scaling -- <cmd>: a training command at 1..N workers,\n"
    "          or (--nodes 1,2,3) on 1..N hosts\n"
    "\n"
    "Run 'cohort <command> --help' for a command's options.\n";

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists: every thread inherits this mask, so the agent's signalfd is
  // the only receiver of INT/TERM/HUP/USR1/USR2.
  cohort::agent::BlockAgentSignals();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    fmt::print("{}", kUsage);
    return args.empty() ? cohort::kExitUsage : cohort::kExitOk;
  }
  std::string command = args[0];
  args.erase(args.begin());
  if (command == "run") return cohort::cli::RunCommand(args);
  if (command == "store") return cohort::cli::StoreCommand(args);
  if (command == "top") return cohort::cli::TopCommand(args);
  if (command == "bench" && !args.empty() && args[0] == "scaling") {
    return cohort::cli::ScalingCommand(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  if (command == "bench") return cohort::cli::ExecSibling("cohort-bench", args);
  if (command == "submit" || command == "status" || command == "logs" || command == "cancel" ||
      command == "list" || command == "pipeline" || command == "ui" ||
      command == "_run-local-job") {
    args.insert(args.begin(), command);
    return cohort::cli::ExecSibling("cohort-jobs", args);
  }
  fmt::print(stderr, "cohort: unknown command '{}'\n\n{}", command, kUsage);
  return cohort::kExitUsage;
}
