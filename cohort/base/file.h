// Whole-file reads, the one way every layer reads a spec, a manifest, an output value or a
// /proc file, and whole-file replacement (readers see the old or the new text, never part).
// Thread-safety: pure functions (each call opens its own stream).
#pragma once

#include <string>

#include "cohort/base/status.h"

namespace cohort {

// The bytes of the file at `path`. kNotFound ("cannot read PATH: No such file or
// directory") when it cannot be opened, kDataLoss when reading fails midway.
Result<std::string> ReadFileToString(const std::string& path);

// Writes `text` to a temporary file beside `path` and renames it over `path`: a reader sees
// the old contents or the new, never a part. Not synced to disk (for files between
// processes of one machine; checkpoints use their own durable write).
Status ReplaceFile(const std::string& path, const std::string& text);

}  // namespace cohort
