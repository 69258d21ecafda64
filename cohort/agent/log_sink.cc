// Implements LogSink. Thread-safety: single owner (the monitor thread).
#include "cohort/agent/log_sink.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>

namespace cohort::agent {
namespace {
constexpr size_t kTailLines = 20;
constexpr size_t kMaxPartial = 1 << 20;  // a line longer than this is emitted in pieces

}  // namespace

LogSink::LogSink(int rank, ConsoleMerger* console, const std::string& file_path,
                 std::function<void(int, std::string_view)> on_line)
    : rank_(rank), console_(console), on_line_(std::move(on_line)) {
  if (!file_path.empty()) file_ = std::fopen(file_path.c_str(), "ae");
}

LogSink::~LogSink() {
  Finish();
  if (file_) std::fclose(file_);
}

bool LogSink::Drain(int fd) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      Consume(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (file_) std::fflush(file_);
      return true;
    }
    if (file_) std::fflush(file_);
    return false;  // EOF or error
  }
}

void LogSink::Consume(const char* data, size_t n) {
  if (file_) std::fwrite(data, 1, n, file_);
  partial_.append(data, n);
  size_t start = 0;
  for (;;) {
    size_t nl = partial_.find('\n', start);
    if (nl == std::string::npos) break;
    EmitLine(std::string_view(partial_).substr(start, nl - start));
    start = nl + 1;
  }
  partial_.erase(0, start);
  if (partial_.size() > kMaxPartial) {
    EmitLine(partial_);
    partial_.clear();
  }
}

void LogSink::EmitLine(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (!line.empty()) {
    tail_.emplace_back(line);
    if (tail_.size() > kTailLines) tail_.pop_front();
  }
  if (console_) console_->Add(rank_, line);
  if (on_line_) on_line_(rank_, line);
}

void LogSink::Finish() {
  if (!partial_.empty()) {
    EmitLine(partial_);
    partial_.clear();
  }
  if (file_) std::fflush(file_);
}

std::string LogSink::LastLine() const { return tail_.empty() ? std::string() : tail_.back(); }

}  // namespace cohort::agent
