// Implements FlightRecorder and its process-wide SIGUSR1 dumper. Thread-safety: see header.
#include "cohort/comm/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <thread>

#include "cohort/base/flight_record.h"
#include "cohort/base/time.h"

namespace cohort::comm {
namespace {

std::string_view StateName(OpState s) {
  switch (s) {
    case OpState::kIssued: return "issued";
    case OpState::kStarted: return "started";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
  }
  return "?";
}

// Process-wide registry of recorders for SIGUSR1.
struct Dumper {
  Mutex mu;
  std::set<const FlightRecorder*> recorders COHORT_GUARDED_BY(mu);
  int pipe_fds[2] = {-1, -1};  // written once, before the thread and the handler exist
  bool started COHORT_GUARDED_BY(mu) = false;
};

Dumper& TheDumper() {
  static Dumper* d = new Dumper();  // lives until exit; the dumper thread uses it
  return *d;
}

void OnSigusr1(int) {
  char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(TheDumper().pipe_fds[1], &byte, 1);
}

void Register(const FlightRecorder* r) {
  Dumper& d = TheDumper();
  MutexLock lock(&d.mu);
  d.recorders.insert(r);
  if (d.started) return;
  d.started = true;
  if (::pipe2(d.pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) return;
  struct sigaction sa {};
  sa.sa_handler = OnSigusr1;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGUSR1, &sa, nullptr);
  std::thread([&d] {
    pthread_setname_np(pthread_self(), "flight-dump");
    for (;;) {
      pollfd p{d.pipe_fds[0], POLLIN, 0};
      if (::poll(&p, 1, -1) <= 0) continue;
      char buf[64];
      while (::read(d.pipe_fds[0], buf, sizeof(buf)) > 0) {
      }
      MutexLock lock(&d.mu);
      for (const FlightRecorder* r : d.recorders) r->DumpNow("SIGUSR1");
    }
  }).detach();
}

void Unregister(const FlightRecorder* r) {
  Dumper& d = TheDumper();
  MutexLock lock(&d.mu);
  d.recorders.erase(r);
}

}  // namespace

FlightRecorder::FlightRecorder(int rank, size_t capacity, std::string dump_dir)
    : rank_(rank), dump_dir_(std::move(dump_dir)), ring_(std::max<size_t>(capacity, 1)) {
  Register(this);
}

FlightRecorder::~FlightRecorder() { Unregister(this); }

size_t FlightRecorder::Record(const OpDesc& desc) {
  MutexLock lock(&mu_);
  size_t id = next_;
  ring_[id] = Entry{desc, OpState::kIssued, WallSeconds(), 0, 0, ""};
  next_ = (next_ + 1) % ring_.size();
  used_ = std::min(used_ + 1, ring_.size());
  return id;
}

void FlightRecorder::Update(size_t id, uint32_t seq, OpState state, const std::string& error) {
  MutexLock lock(&mu_);
  Entry& e = ring_[id % ring_.size()];
  if (e.desc.seq != seq) return;  // overwritten by newer entries
  e.state = state;
  if (state == OpState::kStarted) e.started = WallSeconds();
  if (state == OpState::kCompleted || state == OpState::kFailed) e.ended = WallSeconds();
  if (!error.empty()) e.error = error;
}

std::string FlightRecorder::Dump() const {
  MutexLock lock(&mu_);
  std::vector<FlightRecordEntry> entries;
  size_t first = (next_ + ring_.size() - used_) % ring_.size();
  for (size_t i = 0; i < used_; ++i) {
    const Entry& e = ring_[(first + i) % ring_.size()];
    FlightRecordEntry out;
    out.seq = e.desc.seq;
    out.op = OpKindName(e.desc.kind);
    out.dtype = DataTypeName(e.desc.dtype);
    out.redop = ReduceOpName(e.desc.op);
    out.count = e.desc.count;
    out.root = e.desc.root;
    out.state = StateName(e.state);
    out.start = e.started > 0 ? e.started : e.issued;
    out.ms = e.ended > 0 ? (e.ended - e.started) * 1e3
             : e.started > 0 ? (WallSeconds() - e.started) * 1e3
                             : 0.0;
    out.error = e.error;
    entries.push_back(std::move(out));
  }
  return FormatFlightRecord(rank_, entries);
}

void FlightRecorder::DumpNow(const std::string& reason) const {
  std::string text = fmt::format("[flight recorder dump: {}]\n{}", reason, Dump());
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  if (!dump_dir_.empty()) {
    std::string path = FlightRecordPath(dump_dir_, rank_);
    if (FILE* f = std::fopen(path.c_str(), "a")) {
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
  }
}

}  // namespace cohort::comm
