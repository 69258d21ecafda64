// Implements ShmGroup. Thread-safety: see shm_group.h. Cross-process visibility relies on
// seq_cst atomics in the shared segment (Dekker-style sleeper/publisher handshake).
#include "cohort/comm/transport/shm/shm_group.h"

#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "cohort/base/strings.h"

namespace cohort::comm {
namespace {

constexpr uint64_t kMagic = 0x636f686f72747368ull;  // "cohortsh"

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t members;
  uint32_t reserved;
  uint64_t slot_bytes;
  std::atomic<uint32_t> aborted;
};

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, value, timeout, nullptr, 0);
}

bool Reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

// False once the process is gone or a zombie (exited, not yet reaped by its parent).
bool ProcessAlive(int pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "re");
  if (!f) return ::kill(pid, 0) == 0 || errno != ESRCH;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');
  if (!close || close[1] == '\0') return true;
  char state = close[2];
  return state != 'Z' && state != 'X';
}

}  // namespace

struct ShmGroup::Control {
  alignas(64) std::atomic<uint32_t> arrive;
  alignas(64) std::atomic<uint32_t> depart;
  alignas(64) std::atomic<uint32_t> sleepers;
  int32_t pid;
  // descs[n % kDescRing] is written before arrival n is published. A member runs at most a
  // few arrivals ahead of the slowest (BeginChunk bounds it), so the ring never laps a
  // reader.
  OpDesc descs[16];
};
constexpr uint32_t kDescRing = 16;

ShmGroup::Control& ShmGroup::control(int member) const {
  return reinterpret_cast<Control*>(base_ + control_offset_)[member];
}

char* ShmGroup::slot(int member, int buffer) const {
  return base_ + data_offset_ + (static_cast<size_t>(member) * 2 + buffer) * slot_bytes_;
}

Result<std::unique_ptr<ShmGroup>> ShmGroup::Create(store::Store& store, const std::string& prefix,
                                                   std::vector<int> ranks, int index,
                                                   size_t slot_bytes, Deadline deadline) {
  std::unique_ptr<ShmGroup> g(new ShmGroup(std::move(ranks), index, AlignUp(slot_bytes, 4096)));
  const int n = g->size();
  g->control_offset_ = AlignUp(sizeof(SegmentHeader), 64);
  g->data_offset_ = AlignUp(g->control_offset_ + sizeof(Control) * n, 4096);
  g->mapped_bytes_ = g->data_offset_ + g->slot_bytes_ * 2 * n;
  const std::string name_key = fmt::format("{}/shm/name", prefix);
  std::string name;
  int fd;
  // Step 1.
  if (index == 0) {
    name = "/cohort-" + RandomHex(8);
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus(fmt::format("shm_open {}", name), errno);
    if (::ftruncate(fd, static_cast<off_t>(g->mapped_bytes_)) != 0) {
      int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      return ErrnoStatus("ftruncate shared segment", err);
    }
  } else {
    // Step 2.
    COHORT_ASSIGN_OR_RETURN(name, store.Get(name_key, deadline));
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus(fmt::format("shm_open {}", name), errno);
  }
  void* base = ::mmap(nullptr, g->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    if (index == 0) ::shm_unlink(name.c_str());
    return ErrnoStatus("mmap shared segment", map_errno);
  }
  g->base_ = static_cast<char*>(base);
  auto* header = reinterpret_cast<SegmentHeader*>(g->base_);
  if (index == 0) {
    header->members = static_cast<uint32_t>(n);
    header->slot_bytes = g->slot_bytes_;
    header->aborted.store(0);
    for (int m = 0; m < n; ++m) new (&g->control(m)) Control();
    header->magic = kMagic;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    Status st = store.Set(name_key, name, deadline);
    if (!st.ok()) {
      ::shm_unlink(name.c_str());
      return st;
    }
  } else if (header->magic != kMagic || header->members != static_cast<uint32_t>(n) ||
             header->slot_bytes != g->slot_bytes_) {
    return FailedPrecondition("shared segment {} does not match this group ({} members)", name,
                              n);
  }
  g->control(index).pid = static_cast<int32_t>(::getpid());
  cpu_set_t cpus;
  int cores = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  if (n > cores) {
    g->spin_pauses_ = 64;
    g->spin_yields_ = 8;
  }
  // Step 3.
  COHORT_RETURN_IF_ERROR(store.Set(fmt::format("{}/shm/member{}", prefix, index), "1", deadline));
  if (index == 0) {
    std::vector<std::string> keys;
    for (int m = 0; m < n; ++m) keys.push_back(fmt::format("{}/shm/member{}", prefix, m));
    Status all = store.Wait(keys, deadline);
    ::shm_unlink(name.c_str());
    COHORT_RETURN_IF_ERROR(all);
  }
  return g;
}

ShmGroup::~ShmGroup() {
  if (base_) ::munmap(base_, mapped_bytes_);
}

void ShmGroup::Publish(std::atomic<uint32_t>& counter, uint32_t value) {
  counter.store(value, std::memory_order_seq_cst);
  if (control(index_).sleepers.load(std::memory_order_seq_cst) > 0) {
    Futex(&counter, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void ShmGroup::Arrive(const OpDesc& desc) {
  const uint32_t n = ++arrivals_;
  control(index_).descs[n % kDescRing] = desc;
  Publish(control(index_).arrive, n);
}

void ShmGroup::Depart() { Publish(control(index_).depart, ++chunks_); }

void ShmGroup::Abort() {
  if (!base_) return;
  auto* header = reinterpret_cast<SegmentHeader*>(base_);
  header->aborted.store(1, std::memory_order_seq_cst);
  for (int m = 0; m < size(); ++m) {
    Futex(&control(m).arrive, FUTEX_WAKE, INT_MAX, nullptr);
    Futex(&control(m).depart, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

Status ShmGroup::WaitCounter(int member, bool arrive, uint32_t target, const OpDesc& desc,
                             Deadline deadline) {
  Control& c = control(member);
  std::atomic<uint32_t>& counter = arrive ? c.arrive : c.depart;
  auto* header = reinterpret_cast<SegmentHeader*>(base_);
  // Spin while the peer is likely running on another core; sleep on the futex soon when
  // ranks outnumber cores (spinning would only steal the peer's time slice).
  for (int i = 0; i < spin_pauses_ + spin_yields_; ++i) {
    if (Reached(counter.load(std::memory_order_acquire), target)) return Status::Ok();
    if (i < spin_pauses_) {
      _mm_pause();
    } else {
      sched_yield();
    }
  }
  for (;;) {
    c.sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = counter.load(std::memory_order_seq_cst);
    if (!Reached(seen, target) && !header->aborted.load()) {
      int64_t ms = std::min<int64_t>(deadline.RemainingMs(), 100);
      timespec ts{ms / 1000, (ms % 1000) * 1000000};
      Futex(&counter, FUTEX_WAIT, seen, &ts);
    }
    c.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (Reached(counter.load(std::memory_order_acquire), target)) return Status::Ok();
    if (header->aborted.load()) return Cancelled("{}: the communicator was aborted", desc.ToString());
    if (c.pid > 0 && c.pid != ::getpid() && !ProcessAlive(c.pid)) {
      return Unavailable("{}: rank {} (pid {}) exited", desc.ToString(), ranks_[member], c.pid);
    }
    if (deadline.expired()) {
      return DeadlineExceeded("{}: timed out waiting for rank {} to {}", desc.ToString(),
                              ranks_[member], arrive ? "arrive" : "finish the previous chunk");
    }
  }
}

Result<int> ShmGroup::BeginChunk(const OpDesc& desc, Deadline deadline) {
  const uint32_t chunk = chunks_;
  if (chunk >= 2) {
    for (int m = 0; m < size(); ++m) {
      if (m == index_) continue;
      COHORT_RETURN_IF_ERROR(WaitCounter(m, false, chunk - 1, desc, deadline));
    }
  }
  return static_cast<int>(chunk % 2);
}

Status ShmGroup::WaitArrival(int member, const OpDesc& desc, Deadline deadline) {
  if (member == index_) return Status::Ok();
  COHORT_RETURN_IF_ERROR(WaitCounter(member, true, arrivals_, desc, deadline));
  const OpDesc theirs = control(member).descs[arrivals_ % kDescRing];
  if (!(theirs == desc)) {
    return FailedPrecondition(
        "collective mismatch: rank {} is in {} but rank {} is in {}; every rank must issue the "
        "same collectives in the same order",
        ranks_[index_], desc.ToString(), ranks_[member], theirs.ToString());
  }
  return Status::Ok();
}

Status ShmGroup::WaitArrivals(const OpDesc& desc, Deadline deadline) {
  for (int m = 0; m < size(); ++m) COHORT_RETURN_IF_ERROR(WaitArrival(m, desc, deadline));
  return Status::Ok();
}

}  // namespace cohort::comm
