// `cohort bench scaling`: the training command at 1..N workers, a table and a plot
// (see scaling_command.cc). Thread-safety: main thread only.
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

int ScalingCommand(const std::vector<std::string>& args);

}  // namespace cohort::cli
