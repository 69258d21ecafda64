// ConsoleMerger: collapses identical lines that several local ranks print at about the same
// time into one console line, "[ranks 0-3,5]: text" (a lone line keeps "[rank2]: text").
// A line waits at most `window` for the other ranks (or until every rank printed it), and a
// rank's lines keep their order. The per-rank log files are written elsewhere, unmerged.
//
// Thread-safety: owned by the agent's monitor thread.
#pragma once

#include <deque>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "cohort/base/time.h"

namespace cohort::agent {

class ConsoleMerger {
 public:
  // `fd`: the console stream; `ranks`: how many ranks print to it; `window` 0 disables
  // merging (every line is written at once).
  ConsoleMerger(int fd, int ranks, Duration window);
  ~ConsoleMerger() { FlushAll(); }

  void Add(int rank, std::string_view line);
  // Writes the lines that are due (complete, or older than the window).
  void FlushDue();
  void FlushAll();
  // Time until the oldest pending line is due; -1 when nothing is pending (poll timeout).
  int PollTimeoutMs() const;

  // "[rank3]: " or "[ranks 0-2,5]: ".
  static std::string Prefix(const std::set<int>& ranks);

 private:
  struct Entry {
    uint64_t seq;
    std::string text;
    std::set<int> ranks;
    SteadyClock::time_point first_seen;
  };
  void WriteFront();

  const int fd_;
  const size_t ranks_;
  const Duration window_;
  std::deque<Entry> pending_;
  std::map<int, uint64_t> last_seq_;  // per rank: the entry it joined last
  uint64_t next_seq_ = 1;
};

}  // namespace cohort::agent
