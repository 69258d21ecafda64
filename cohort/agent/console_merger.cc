// Console line merging (see console_merger.h). Thread-safety: monitor thread only.
#include "cohort/agent/console_merger.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace cohort::agent {
namespace {

constexpr size_t kMaxPending = 1024;

void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // console gone: nothing better to do
    done += static_cast<size_t>(n);
  }
}

}  // namespace

ConsoleMerger::ConsoleMerger(int fd, int ranks, Duration window)
    : fd_(fd), ranks_(static_cast<size_t>(std::max(1, ranks))), window_(window) {}

std::string ConsoleMerger::Prefix(const std::set<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("[rank{}]: ", *ranks.begin());
  std::string out = "[ranks ";
  auto it = ranks.begin();
  bool first = true;
  while (it != ranks.end()) {
    int lo = *it, hi = lo;
    for (++it; it != ranks.end() && *it == hi + 1; ++it) hi = *it;
    out += (first ? "" : ",") + (lo == hi ? std::to_string(lo) : fmt::format("{}-{}", lo, hi));
    first = false;
  }
  return out + "]: ";
}

void ConsoleMerger::Add(int rank, std::string_view line) {
  if (window_ <= Duration::zero() || ranks_ == 1) {
    WriteAll(fd_, Prefix({rank}) + std::string(line) + "\n");
    return;
  }
  const uint64_t after = last_seq_[rank];
  for (auto& e : pending_) {
    if (e.seq > after && e.text == line && !e.ranks.count(rank)) {
      e.ranks.insert(rank);
      last_seq_[rank] = e.seq;
      FlushDue();
      return;
    }
  }
  pending_.push_back({next_seq_, std::string(line), {rank}, SteadyClock::now()});
  last_seq_[rank] = next_seq_++;
  FlushDue();
}

void ConsoleMerger::WriteFront() {
  const Entry& e = pending_.front();
  WriteAll(fd_, Prefix(e.ranks) + e.text + "\n");
  pending_.pop_front();
}

void ConsoleMerger::FlushDue() {
  const auto now = SteadyClock::now();
  // Lines go out in arrival order: a complete entry behind an incomplete one waits for it.
  while (!pending_.empty()) {
    const Entry& e = pending_.front();
    bool due = e.ranks.size() >= ranks_ || now - e.first_seen >= window_ ||
               pending_.size() > kMaxPending;
    if (!due) break;
    WriteFront();
  }
}

void ConsoleMerger::FlushAll() {
  while (!pending_.empty()) WriteFront();
}

int ConsoleMerger::PollTimeoutMs() const {
  if (pending_.empty()) return -1;
  auto left = window_ - (SteadyClock::now() - pending_.front().first_seen);
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::max<int64_t>(0, ms));
}

}  // namespace cohort::agent
