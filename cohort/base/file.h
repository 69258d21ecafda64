// Whole-file reads, the one way every layer reads a spec, a manifest, an output value or a
// /proc file. Thread-safety: pure functions (each call opens its own stream).
#pragma once

#include <string>

#include "cohort/base/status.h"

namespace cohort {

// The bytes of the file at `path`. kNotFound ("cannot read PATH: No such file or
// directory") when it cannot be opened, kDataLoss when reading fails midway.
Result<std::string> ReadFileToString(const std::string& path);

}  // namespace cohort
