// `cohort submit | status | logs | cancel | list` and the hidden `_run-local-job`: job specs
// submitted to a backend (local, slurm, kubernetes) with the history in SQLite.
// Thread-safety: each command runs on the main thread.
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

int SubmitCommand(const std::vector<std::string>& args);
int StatusCommand(const std::vector<std::string>& args);
int LogsCommand(const std::vector<std::string>& args);
int CancelCommand(const std::vector<std::string>& args);
int ListCommand(const std::vector<std::string>& args);
int RunLocalJobCommand(const std::vector<std::string>& args);

}  // namespace cohort::cli
