// SnapshotStore (see snapshot_store.h). Thread-safety: `mu` guards the slots' flags and
// steps, the newest snapshot and the counters; a slot's bytes, mapping and file belong to
// whoever marked it (filling: the owner thread; writing: the persister, read only), so
// they are touched unlocked; renames of a slot's file happen under `mu`.
#include "cohort/train/snapshot_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "cohort/base/file.h"
#include "cohort/base/log.h"
#include "cohort/base/mutex.h"
#include "cohort/train/checkpoint_file.h"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;
constexpr char kLog[] = "train";
constexpr int kMaxSlots = 3;
constexpr size_t kAlign = 64;  // the payload starts on a cache line

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::string SnapshotFileName(int rank, int64_t step) {
  return fmt::format("snap-{}-{:012d}.cohort", rank, step);
}

bool ParseSnapshotName(const std::string& name, int* rank, int64_t* step) {
  constexpr std::string_view kPrefix = "snap-", kSuffix = ".cohort";
  if (name.size() < kPrefix.size() + 2 + 12 + kSuffix.size()) return false;
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  if (name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return false;
  const std::string body = name.substr(kPrefix.size(), name.size() - kPrefix.size() -
                                                           kSuffix.size());
  const size_t dash = body.find('-');
  if (dash == std::string::npos || dash == 0 || dash > 7 || body.size() - dash - 1 != 12) {
    return false;
  }
  const std::string r = body.substr(0, dash), s = body.substr(dash + 1);
  if (!std::all_of(r.begin(), r.end(), ::isdigit) || !std::all_of(s.begin(), s.end(), ::isdigit)) {
    return false;
  }
  *rank = std::stoi(r);
  *step = std::stoll(s);
  return true;
}

// One staging buffer: a mapped file in the snapshot directory, or anonymous memory.
struct Slot {
  int id = 0;
  std::string path;      // its file now (a free slot's name, or the published name)
  int fd = -1;           // -1: anonymous memory
  char* data = nullptr;  // mapping of `mapped` bytes
  size_t mapped = 0;
  size_t size = 0;       // bytes of the snapshot it holds
  int64_t step = -1;
  bool filling = false, published = false, writing = false;
  bool reserving = false;  // the reserver thread is giving it room
  bool Free() const { return !filling && !published && !writing && !reserving; }
};

struct SnapshotStore::Impl {
  explicit Impl(Options o) : opt(std::move(o)), disk(opt.disk_dir) {
    if (!opt.disk_dir.empty()) persister = std::thread([this] { Persist(); });
  }

  ~Impl() {
    {
      MutexLock lock(&mu);
      stop = true;
    }
    cv.SignalAll();
    if (reserver.joinable()) reserver.join();
    if (persister.joinable()) persister.join();
    for (auto& s : slots) {
      if (s->data != nullptr) ::munmap(s->data, s->mapped);
      if (s->fd >= 0) ::close(s->fd);
      // The published snapshot stays in the node's directory (that is its point); the
      // free slots' files are only staging space.
      if (!s->path.empty() && !s->published) ::unlink(s->path.c_str());
    }
  }

  std::string FreeSlotPath(int id) const {
    return (fs::path(opt.memory_dir) / fmt::format(".slot-{}-{}", opt.rank, id)).string();
  }

  // Gives `s` room for `size` bytes: in the snapshot directory (space reserved first, so a
  // full tmpfs is an error here and never a SIGBUS later), else in anonymous memory.
  Status Prepare(Slot& s, size_t size) {
    if (!opt.memory_dir.empty() && !memory_full.load()) {
      Status st = PrepareFile(s, size);
      if (st.ok()) return st;
      if (!memory_full.exchange(true)) {  // said once, by whichever thread found it
        COHORT_LOG_WARN(kLog,
                        "cannot keep snapshots of {} MB in {}: {}; they are kept in the "
                        "worker's memory only (lost if it crashes). Give the node more shared "
                        "memory (a container's --shm-size, or a memory-backed volume at "
                        "/dev/shm)",
                        size >> 20, opt.memory_dir, st.message());
      }
    }
    if (s.fd >= 0) {  // a file slot of before the directory filled up
      Unmap(s);
      ::close(s.fd);
      ::unlink(s.path.c_str());
      s.fd = -1;
      s.path.clear();
    }
    if (s.mapped < size) {
      Unmap(s);
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return ErrnoStatus(fmt::format("allocating {} bytes", size), errno);
      s.data = static_cast<char*>(p);
      s.mapped = size;
      TouchPages(s);
    }
    return Status::Ok();
  }

  // Writes one zero per page (the pages hold zeros): the first write to a page costs far
  // more than copying into it on some machines (a virtual machine's host backs it then:
  // 1.5 s per GB measured here, against 0.08 s for the copy), and it belongs in the
  // reservation, not in a snapshot's copy.
  static void TouchPages(Slot& s) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    for (size_t i = 0; i < s.mapped; i += page) {
      reinterpret_cast<volatile char*>(s.data)[i] = 0;
    }
  }

  // A slot of another size is a new file: one that a reader may have mapped is never
  // truncated under it (that would fault the reader), only unlinked.
  Status PrepareFile(Slot& s, size_t size) {
    if (s.fd >= 0 && s.mapped == size && s.data != nullptr) return Status::Ok();
    Unmap(s);
    if (s.fd >= 0) {
      ::close(s.fd);
      ::unlink(s.path.c_str());
      s.fd = -1;
    }
    s.path = FreeSlotPath(s.id);
    ::unlink(s.path.c_str());  // an earlier process's slot of this name
    s.fd = ::open(s.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (s.fd < 0) return ErrnoStatus("create " + s.path, errno);
    if (int err = ::posix_fallocate(s.fd, 0, static_cast<off_t>(size)); err != 0) {
      return ErrnoStatus(fmt::format("reserving {} bytes", size), err);
    }
    // MAP_POPULATE: the page tables are filled here at once, not by a fault per page
    // during the first copy.
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, s.fd, 0);
    if (p == MAP_FAILED) return ErrnoStatus("map " + s.path, errno);
    s.data = static_cast<char*>(p);
    s.mapped = size;
    TouchPages(s);
    return Status::Ok();
  }

  static void Unmap(Slot& s) {
    if (s.data != nullptr) ::munmap(s.data, s.mapped);
    s.data = nullptr;
    s.mapped = 0;
  }

  // A snapshot that is neither the newest nor being written: its file becomes free space.
  void Recycle(Slot& s) COHORT_REQUIRES(mu) {
    if (s.fd < 0 || s.path.empty()) return;
    const std::string free_path = FreeSlotPath(s.id);
    if (s.path != free_path && ::rename(s.path.c_str(), free_path.c_str()) == 0) {
      s.path = free_path;
    }
  }

  // Older snapshots of this rank left by an earlier process (a crashed worker): superseded
  // once this one publishes.
  void RemoveOlderFiles(int64_t newest) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(opt.memory_dir, ec)) {
      int rank = 0;
      int64_t step = 0;
      if (ParseSnapshotName(e.path().filename().string(), &rank, &step) && rank == opt.rank &&
          step != newest) {
        fs::remove(e.path(), ec);
      }
    }
  }

  // Starts the reserver once: it gives the slots not made yet room for `size` bytes in the
  // background, so that only the first snapshot waits for memory to be reserved (on
  // tmpfs the pages are zeroed: seconds per GB on some machines).
  void ReserveRest(size_t size) COHORT_REQUIRES(mu) {
    if (reserver.joinable()) return;
    std::vector<Slot*> more;
    // Without a checkpoint directory no slot is ever being written: two are enough.
    const int needed = opt.disk_dir.empty() ? 2 : kMaxSlots;
    while (static_cast<int>(slots.size()) < needed) {
      slots.push_back(std::make_unique<Slot>());
      slots.back()->id = static_cast<int>(slots.size()) - 1;
      slots.back()->reserving = true;
      more.push_back(slots.back().get());
    }
    reserver = std::thread([this, more, size] {
      for (Slot* s : more) {
        {
          MutexLock lock(&mu);
          if (stop) {
            s->reserving = false;
            continue;
          }
        }
        Status st = Prepare(*s, size);  // the slot is the reserver's while `reserving`
        if (!st.ok()) COHORT_LOG_DEBUG(kLog, "reserving a snapshot slot: {}", st.message());
        MutexLock lock(&mu);
        s->reserving = false;
        cv.SignalAll();
      }
    });
  }

  void Persist();
  void FaultInjectedWrite(const Slot& s);

  const Options opt;
  CheckpointDir disk;  // the persister's
  std::atomic<bool> memory_full{false};  // the snapshot directory could not hold a slot
  bool removed_older = false;  // owner thread only
  mutable Mutex mu;
  CondVar cv;
  std::vector<std::unique_ptr<Slot>> slots COHORT_GUARDED_BY(mu);
  Slot* newest COHORT_GUARDED_BY(mu) = nullptr;
  Status last_error COHORT_GUARDED_BY(mu);  // the last write's
  bool stop COHORT_GUARDED_BY(mu) = false;
  // Each Flush asks for one write at once (no gap, no backoff): requests made, the newest
  // one a write has started for, and the newest one a failed write was started for.
  int64_t flush_requests COHORT_GUARDED_BY(mu) = 0;
  int64_t flush_served COHORT_GUARDED_BY(mu) = 0;
  int64_t flush_failed COHORT_GUARDED_BY(mu) = 0;
  SnapshotStats stats COHORT_GUARDED_BY(mu);
  std::thread reserver;   // started by the first Take (ReserveRest), under `mu`
  std::thread persister;  // last: started when everything above exists
};

void SnapshotStore::Impl::FaultInjectedWrite(const Slot& s) {
  std::error_code ec;
  fs::create_directories(opt.disk_dir, ec);
  const std::string tmp = TemporaryPathFor(disk.PathFor(s.step), ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, s.data, s.size / 2);
    ::fsync(fd);
  }
  fmt::print("persister: injecting SIGKILL half-way through writing step {}\n", s.step);
  std::fflush(stdout);
  ::kill(::getpid(), SIGKILL);
}

void SnapshotStore::Impl::Persist() {
  // Training threads come first: the persister runs at a lower priority (nice +10, this
  // thread only), so that its encoding and I/O take the CPU training leaves idle rather
  // than stretch the snapshot's copy and the step (a nice +10 thread still gets about a
  // tenth of a contended core: writes are delayed, never starved).
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10) != 0) {
    COHORT_LOG_DEBUG(kLog, "lowering the persister's priority: {}", std::strerror(errno));
  }
  auto backoff = std::chrono::seconds(1);
  std::optional<Deadline> retry_at;
  int64_t failed_step = -1;
  // After a write of W seconds the next starts no sooner than kWriteGap x W later (unless
  // Flush waits): the disk's copy trails by a few snapshots instead of the writes taking
  // the machine's CPU and I/O all the time (at most 1 / (1 + kWriteGap) of it).
  constexpr double kWriteGap = 3.0;
  std::optional<Deadline> next_write;
  for (;;) {
    Slot* s = nullptr;
    int64_t serving = 0;  // the Flush request this write answers
    {
      MutexLock lock(&mu);
      for (;;) {
        if (stop) return;
        s = newest;
        if (s == nullptr || s->step <= stats.persisted_step) {
          cv.Wait(&mu);
        } else if (retry_at && s->step == failed_step && !retry_at->expired() &&
                   flush_served == flush_requests) {
          cv.WaitUntil(&mu, *retry_at);
        } else if (next_write && !next_write->expired() && flush_served == flush_requests) {
          cv.WaitUntil(&mu, *next_write);
        } else {
          break;
        }
      }
      s->writing = true;
      serving = flush_served = flush_requests;
    }
    if (opt.fault_write_step >= 0 && s->step >= opt.fault_write_step) FaultInjectedWrite(*s);
    const auto started = std::chrono::steady_clock::now();
    Status st = disk.WriteEncoded(s->step, std::string_view(s->data, s->size), opt.keep);
    const double seconds = SecondsSince(started);
    MutexLock lock(&mu);
    s->writing = false;
    if (st.ok()) {
      stats.persisted_step = s->step;
      ++stats.persisted;
      last_error = Status::Ok();
      backoff = std::chrono::seconds(1);
      retry_at.reset();
      next_write = Deadline::After(std::chrono::duration_cast<Duration>(
          std::chrono::duration<double>(kWriteGap * seconds)));
      COHORT_LOG_DEBUG(kLog, "checkpoint of step {} written to {} in {:.2f} s", s->step,
                       opt.disk_dir, seconds);
    } else {
      ++stats.write_failures;
      last_error = st;
      flush_failed = serving;
      failed_step = s->step;
      retry_at = Deadline::After(backoff);
      COHORT_LOG_WARN(kLog,
                      "checkpoint of step {} could not be written: {}; training goes on and the "
                      "write is retried in {} s (or with the next snapshot); free space in {}",
                      s->step, st.message(), backoff.count(), opt.disk_dir);
      backoff = std::min(backoff * 2, std::chrono::seconds(30));
    }
    if (!s->published) Recycle(*s);
    cv.SignalAll();  // Flush
  }
}

SnapshotStore::SnapshotStore(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
SnapshotStore::~SnapshotStore() = default;

const SnapshotStore::Options& SnapshotStore::options() const { return impl_->opt; }

Status SnapshotStore::Take(int64_t step, const std::string& meta, size_t payload_size,
                           const Filler& fill) {
  Impl& m = *impl_;
  const auto started = std::chrono::steady_clock::now();
  Slot* s = nullptr;
  {
    MutexLock lock(&m.mu);
    if (m.newest != nullptr && m.newest->step == step) return Status::Ok();  // already held
    // At most kMaxSlots: one filling, the newest, one being written. A slot the reserver
    // is still preparing is waited for (only right after the first snapshot).
    for (;;) {
      bool reserving = false;
      for (auto& slot : m.slots) {
        reserving = reserving || slot->reserving;
        if (slot->Free()) {
          s = slot.get();
          break;
        }
      }
      if (s != nullptr || !reserving) break;
      m.cv.Wait(&m.mu);
    }
    if (s == nullptr) {
      if (static_cast<int>(m.slots.size()) >= kMaxSlots) {
        return Internal("no free snapshot slot (a bug: {} slots in use)", m.slots.size());
      }
      m.slots.push_back(std::make_unique<Slot>());
      s = m.slots.back().get();
      s->id = static_cast<int>(m.slots.size()) - 1;
    }
    s->filling = true;
  }
  // Meta padded with spaces (still JSON) so that the payload starts aligned.
  std::string padded = meta;
  padded.append((kAlign - (kCheckpointHeaderSize + padded.size()) % kAlign) % kAlign, ' ');
  const size_t size = kCheckpointHeaderSize + padded.size() + payload_size;
  if (Status st = m.Prepare(*s, size); !st.ok()) {
    MutexLock lock(&m.mu);
    s->filling = false;
    return st.WithContext(fmt::format("taking the snapshot of step {}", step));
  }
  char* p = s->data;
  std::memcpy(p + kCheckpointHeaderSize, padded.data(), padded.size());
  uint32_t crc = Crc32(0, padded.data(), padded.size());
  crc = fill(p + kCheckpointHeaderSize + padded.size(), crc);
  PutCheckpointHeader(p, crc, padded.size(), payload_size);
  s->size = size;
  s->step = step;
  {
    MutexLock lock(&m.mu);
    if (s->fd >= 0) {
      const std::string name =
          (fs::path(m.opt.memory_dir) / SnapshotFileName(m.opt.rank, step)).string();
      if (::rename(s->path.c_str(), name.c_str()) == 0) {
        s->path = name;
      } else {
        COHORT_LOG_WARN(kLog, "publishing snapshot {}: {}", name, std::strerror(errno));
      }
    }
    Slot* old = m.newest;
    m.newest = s;
    s->filling = false;
    s->published = true;
    if (old != nullptr) {
      old->published = false;
      if (!old->writing) {
        if (!m.opt.disk_dir.empty() && old->step > m.stats.persisted_step) ++m.stats.dropped;
        m.Recycle(*old);
      }
    }
    ++m.stats.taken;
    if (s->fd < 0 && !m.opt.memory_dir.empty()) ++m.stats.in_process;
    m.stats.last_step = step;
    m.stats.last_blocking_seconds = SecondsSince(started);
    m.stats.blocking_seconds += m.stats.last_blocking_seconds;
    m.ReserveRest(size);
  }
  m.cv.SignalAll();
  if (!m.removed_older && s->fd >= 0) {
    m.RemoveOlderFiles(step);
    m.removed_older = true;
  }
  return Status::Ok();
}

Status SnapshotStore::Flush(Deadline deadline) {
  Impl& m = *impl_;
  if (m.opt.disk_dir.empty()) return Status::Ok();
  MutexLock lock(&m.mu);
  const int64_t request = ++m.flush_requests;
  m.cv.SignalAll();
  Status result;
  while (m.newest != nullptr && m.stats.persisted_step < m.newest->step) {
    // A write started for this request failed: no waiting it out. (One started before it,
    // which may have failed for a reason gone since, does not count.)
    if (m.flush_failed >= request) {
      result = m.last_error;
      break;
    }
    if (deadline.expired()) {
      result = !m.last_error.ok()
                   ? m.last_error
                   : DeadlineExceeded("the checkpoint of step {} was still being written to {}",
                                      m.newest->step, m.opt.disk_dir);
      break;
    }
    m.cv.WaitUntil(&m.mu, deadline);
  }
  return result;
}

SnapshotStats SnapshotStore::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

Result<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("stat " + path, err);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = size == 0 ? nullptr : ::mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return ErrnoStatus("map " + path, err);
  return std::shared_ptr<const MappedFile>(new MappedFile(static_cast<const char*>(p), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

Status FoundSnapshot::Recheck() const {
  return VerifyCheckpoint(file->bytes(), path).status();
}

std::vector<size_t> AlignedOffsets(const std::vector<size_t>& sizes, size_t* total) {
  std::vector<size_t> offsets;
  size_t at = 0;
  for (size_t n : sizes) {
    at = (at + kAlign - 1) / kAlign * kAlign;
    offsets.push_back(at);
    at += n;
  }
  *total = at;
  return offsets;
}

uint32_t FillPayload(const std::vector<PayloadPiece>& pieces, size_t total, char* payload,
                     uint32_t crc) {
  constexpr size_t kStep = size_t{1} << 20;  // still in the cache for the checksum
  size_t done = 0;
  auto zeros_to = [&](size_t end) {
    if (end <= done) return;
    std::memset(payload + done, 0, end - done);
    crc = Crc32(crc, payload + done, end - done);
    done = end;
  };
  for (const PayloadPiece& piece : pieces) {
    zeros_to(piece.offset);
    const char* src = static_cast<const char*>(piece.data);
    for (size_t k = 0; k < piece.bytes; k += kStep) {
      const size_t m = std::min(kStep, piece.bytes - k);
      std::memcpy(payload + piece.offset + k, src + k, m);
      crc = Crc32(crc, payload + piece.offset + k, m);
    }
    done = piece.offset + piece.bytes;
  }
  zeros_to(total);
  return crc;
}

Result<FoundSnapshot> NewestSnapshot(const std::string& memory_dir,
                                     const std::string& disk_dir) {
  struct Candidate {
    int64_t step;
    bool memory;
    int rank;
    std::string path;
  };
  std::vector<Candidate> found;
  std::error_code ec;
  if (!memory_dir.empty()) {
    for (const auto& e : fs::directory_iterator(memory_dir, ec)) {
      int rank = 0;
      int64_t step = 0;
      if (ParseSnapshotName(e.path().filename().string(), &rank, &step)) {
        found.push_back({step, true, rank, e.path().string()});
      }
    }
  }
  if (!disk_dir.empty()) {
    CheckpointDir dir(disk_dir);
    for (int64_t step : dir.Steps()) found.push_back({step, false, 0, dir.PathFor(step)});
  }
  if (found.empty()) return NotFound("no snapshot or checkpoint");
  // Newest first; memory before disk at the same step (no disk read).
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.memory > b.memory;
  });
  for (const Candidate& c : found) {
    auto file = MappedFile::Open(c.path);
    Result<CheckpointView> view =
        file.ok() ? VerifyCheckpoint((*file)->bytes(), c.path) : Result<CheckpointView>(file.status());
    if (!view.ok()) {
      COHORT_LOG_WARN(kLog, "skipping unusable {}: {}",
                      c.memory ? "snapshot in memory" : "checkpoint", view.status().message());
      continue;
    }
    FoundSnapshot out;
    out.step = c.step;
    out.path = c.path;
    out.where = c.memory ? fmt::format("the node's memory (snapshot of local rank {})", c.rank)
                         : c.path;
    out.file = std::move(*file);
    out.view = *view;
    return out;
  }
  return DataLoss("{} snapshot(s) or checkpoint(s) found (newest: {}), none readable; move "
                  "them away to start from scratch, or restore a good one",
                  found.size(), found.front().path);
}

}  // namespace cohort::train
