// `cohort top`: the whole job in a terminal, refreshed (see top_command.cc).
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

int TopCommand(const std::vector<std::string>& args);

}  // namespace cohort::cli
