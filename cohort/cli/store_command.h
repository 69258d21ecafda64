// `cohort store --host H --port P`: a standalone embedded store server for multi-node jobs.
// Thread-safety: called once from main().
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

int StoreCommand(const std::vector<std::string>& args);

}  // namespace cohort::cli
