// Test helper (rendezvous_pace_test.cc, rendezvous_carry_test.cc): RendezvousLog, the
// rendezvous log's lines (info and above) while it lives, for tests that assert what a
// node said or act when it said it.
// Thread-safety: Lines and Said may be called from any thread while nodes log; construct it
// before the nodes' threads start and destroy it after they are joined (a logger's list of
// sinks is not guarded).
#pragma once

#include <spdlog/sinks/ringbuffer_sink.h>

#include <algorithm>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "cohort/base/log.h"
#include "cohort/rendezvous/rendezvous_internal.h"

namespace cohort::rendezvous::testing {

class RendezvousLog {
 public:
  RendezvousLog()
      : logger_(log::Get(kLog)),
        level_(logger_->level()),
        sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(10000)) {
    logger_->sinks().push_back(sink_);
    logger_->set_level(spdlog::level::info);
  }
  ~RendezvousLog() {
    auto& sinks = logger_->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    logger_->set_level(level_);
  }
  RendezvousLog(const RendezvousLog&) = delete;
  RendezvousLog& operator=(const RendezvousLog&) = delete;

  std::vector<std::string> Lines() { return sink_->last_formatted(); }
  // Whether a line so far matches `pattern`.
  bool Said(const std::regex& pattern) {
    for (const auto& line : Lines()) {
      if (std::regex_search(line, pattern)) return true;
    }
    return false;
  }

 private:
  std::shared_ptr<spdlog::logger> logger_;
  spdlog::level::level_enum level_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

}  // namespace cohort::rendezvous::testing
