// Whole-file reads, the one way every layer reads a spec, a manifest, an output value or a
// /proc file, whole-file replacement (readers see the old or the new text, never part), and
// private directories (a runtime or log directory that only this user can read or write,
// in a temporary directory shared with other users).
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

// Ok when `path` is a directory (not a symbolic link) owned by this process's effective user
// that no other user can read or write (mode 0700 or stricter); kPermissionDenied saying
// which of these fails and what to do otherwise (kNotFound when it does not exist).
Status CheckPrivateDir(const std::string& path);

// A new directory "<parent>/<prefix>XXXXXX" with an unpredictable name, created atomically
// with mode 0700 (mkdtemp: an existing entry of that name is never used). `parent` empty:
// the system temporary directory ($TMPDIR, else /tmp).
Result<std::string> MakePrivateDir(const std::string& parent, const std::string& prefix);

// "<parent>/<name>-<uid>" (parent empty: $TMPDIR, else /tmp), this user's directory of that
// name that persists between runs: created with mode 0700 when missing, checked with
// CheckPrivateDir when present. Another user's directory of that name (or a link, or one
// others can write) is refused, never used: kPermissionDenied with the fix.
Result<std::string> UserPrivateDir(const std::string& parent, const std::string& name);

}  // namespace cohort
