// LogSink: one worker stream (stdout or stderr) of one attempt. Bytes read from the
// worker's pipe are written whole to <attempt dir>/<rank>/<stream>.log and, line by line
// with a "[rank<R>]: " prefix, to the agent's console stream unless filtered or redirected.
// Keeps the last lines for failure summaries.
//
// Thread-safety: owned by the agent's monitor thread.
#pragma once

#include <cstdio>
#include <deque>
#include <functional>
#include <string>

#include "cohort/agent/console_merger.h"
#include "cohort/base/status.h"

namespace cohort::agent {

class LogSink {
 public:
  // `console` null disables console output (else lines go through its merger).
  // `file_path` empty disables the file. `on_line`, if set, sees every complete line.
  LogSink(int rank, ConsoleMerger* console, const std::string& file_path,
          std::function<void(int rank, std::string_view line)> on_line = nullptr);
  ~LogSink();
  LogSink(const LogSink&) = delete;
  LogSink& operator=(const LogSink&) = delete;

  // Reads what the pipe has now. Returns false at EOF (the pipe is then closed).
  bool Drain(int fd);
  // Flushes a trailing partial line.
  void Finish();
  // The last non-empty line the worker wrote on this stream.
  std::string LastLine() const;
  bool file_ok() const { return file_ != nullptr; }
  // The rank later lines are labelled with (the worker's rank after a live reconfiguration;
  // drain first: what is in the pipe was written under the old rank).
  void SetRank(int rank) { rank_ = rank; }

 private:
  void Consume(const char* data, size_t n);
  void EmitLine(std::string_view line);

  int rank_;
  ConsoleMerger* const console_;
  const std::function<void(int, std::string_view)> on_line_;
  FILE* file_ = nullptr;
  std::string partial_;
  std::deque<std::string> tail_;
};

}  // namespace cohort::agent
