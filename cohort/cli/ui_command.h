// `cohort ui`: web pages over $COHORT_HOME's job and pipeline histories (cohort/ui).
// Thread-safety: main thread only.
#pragma once

#include <string>
#include <vector>

namespace cohort::cli {

int UiCommand(const std::vector<std::string>& args);

}  // namespace cohort::cli
