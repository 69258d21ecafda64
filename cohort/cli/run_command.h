// `cohort run`: the torchrun-compatible launcher. Parses torchrun's flags (both spellings,
// and PET_<FLAG> variables), hosts the embedded store when this node is the rendezvous
// host, and runs the node's agent. Thread-safety: called once from main().
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

// `args` excludes the program name and the "run" word. Returns the process exit code.
int RunCommand(const std::vector<std::string>& args);

}  // namespace cohort::cli
