// Implements strings.h and the value parsers of settings.h. Pure functions, thread-safe.
#include "cohort/base/strings.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <random>


namespace cohort {

std::vector<std::string> Split(std::string_view text, char sep, bool skip_empty) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view part = text.substr(start, end - start);
    if (!(skip_empty && part.empty())) parts.emplace_back(part);
    start = end + 1;
  }
  return parts;
}

std::string_view Trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

std::string ToLower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::optional<int64_t> ParseInt64(std::string_view text) {
  text = Trim(text);
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<double> ParseDouble(std::string_view text) {
  std::string s(Trim(text));
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return value;
}

std::optional<bool> ParseBool(std::string_view text) {
  std::string s = ToLower(Trim(text));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return std::nullopt;
}

std::optional<std::pair<std::string, int>> ParseHostPort(std::string_view text,
                                                         int default_port) {
  text = Trim(text);
  if (text.empty()) return std::nullopt;
  std::string host;
  std::string_view rest;
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = std::string(text.substr(1, close - 1));
    rest = text.substr(close + 1);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      host = std::string(text);
    } else {
      host = std::string(text.substr(0, colon));
      rest = text.substr(colon);
    }
  }
  int port = default_port;
  if (!rest.empty()) {
    if (rest.front() != ':') return std::nullopt;
    auto parsed = ParseInt64(rest.substr(1));
    if (!parsed || *parsed < 0 || *parsed > 65535) return std::nullopt;
    port = static_cast<int>(*parsed);
  }
  if (host.empty() || port < 0) return std::nullopt;
  return std::make_pair(host, port);
}

std::string StripControl(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f) continue;
    // U+0080..U+009F in UTF-8: 0xC2 then 0x80..0x9F (CSI is U+009B).
    if (c == 0xc2 && i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xe0) == 0x80) {
      ++i;
      continue;
    }
    out.push_back(static_cast<char>(c));
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  size_t got = 0;
  if (fd >= 0) {
    while (got < bytes) {
      ssize_t n = ::read(fd, raw.data() + got, bytes - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  if (got < bytes) {  // /dev/urandom unavailable: fall back to the C++ engine
    std::random_device rd;
    for (size_t i = got; i < bytes; ++i) raw[i] = static_cast<char>(rd());
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string ShellQuote(std::string_view text) {
  auto safe = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
           c == '/' || c == ':' || c == '=' || c == ',' || c == '+' || c == '@' || c == '%';
  };
  if (!text.empty() && std::all_of(text.begin(), text.end(), safe)) return std::string(text);
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string ShellJoin(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + ShellQuote(w);
  return out;
}

}  // namespace cohort
