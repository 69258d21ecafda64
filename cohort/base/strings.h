// Small string helpers shared by every layer. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {

std::vector<std::string> Split(std::string_view text, char sep, bool skip_empty = true);
std::string_view Trim(std::string_view text);
bool StartsWith(std::string_view text, std::string_view prefix);
bool EndsWith(std::string_view text, std::string_view suffix);
std::string ToLower(std::string_view text);
// "host:port" -> (host, port); [v6]:port accepted. Port must be 0..65535.
std::optional<std::pair<std::string, int>> ParseHostPort(std::string_view text, int default_port);
// Random lowercase hex string of `bytes` random bytes from /dev/urandom.
std::string RandomHex(size_t bytes);
// `text` without terminal control characters: C0 controls but newline (ESC included, so
// no escape sequence survives), DEL, and the C1 controls U+0080..U+009F. For text from
// elsewhere printed to a terminal.
std::string StripControl(std::string_view text);
// Equality of two secrets in time that depends only on their lengths, not their contents.
bool ConstantTimeEquals(std::string_view a, std::string_view b);
// Whole-text numbers and booleans ("12", "1.5e3", "true"/"1"/"yes"); nullopt otherwise.
std::optional<int64_t> ParseInt64(std::string_view text);
std::optional<double> ParseDouble(std::string_view text);
std::optional<bool> ParseBool(std::string_view text);
// Quotes `text` for a POSIX shell: unchanged when it holds only characters that are safe
// unquoted, else in single quotes (with ' written as '\'').
std::string ShellQuote(std::string_view text);
// The words quoted with ShellQuote, joined by single spaces: a command line for a shell.
std::string ShellJoin(const std::vector<std::string>& words);

}  // namespace cohort
