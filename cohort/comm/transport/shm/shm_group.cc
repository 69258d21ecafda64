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

#include <cctype>
#include <cerrno>
#include <algorithm>
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

bool Hex(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c));
  });
}

// The creator's segment names: "/cohort-", optionally the job's cookie and '-', 16 hex.
bool SegmentName(const std::string& name) {
  constexpr std::string_view kPrefix = "/cohort-";
  if (name.size() < kPrefix.size() + 16 || name.compare(0, kPrefix.size(), kPrefix) != 0) {
    return false;
  }
  std::string_view rest = std::string_view(name).substr(kPrefix.size());
  if (const size_t dash = rest.find('-'); dash != std::string_view::npos) {
    if (dash > 64 || !Hex(rest.substr(0, dash))) return false;
    rest.remove_prefix(dash + 1);
  }
  return rest.size() == 16 && Hex(rest);
}

// Whether the segment behind `fd`, named by the store, can be this group's: created by
// this user (every rank of a job runs as the agent's user), private to it, of its size.
// Anyone who can write the store's key could otherwise make this rank map a segment they
// made, and read what the rank reduces through it.
Status CheckSegment(int fd, const std::string& name, size_t bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(fmt::format("fstat {}", name), errno);
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return PermissionDenied("the shared segment {} named by the store belongs to uid {} with "
                            "mode {:o}, not to this user (uid {}) alone: refused",
                            name, st.st_uid, st.st_mode & 0777, ::geteuid());
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    return FailedPrecondition("the shared segment {} has {} bytes, not this group's {}", name,
                              st.st_size, bytes);
  }
  return Status::Ok();
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

constexpr size_t kPairRingBytes = 64u << 10;

struct ShmGroup::PairControl {
  alignas(64) std::atomic<uint32_t> written;  // bytes produced (mod 2^32), by the sender
  alignas(64) std::atomic<uint32_t> read;     // bytes consumed, by the receiver
  alignas(64) std::atomic<uint32_t> sleepers;
};
constexpr size_t kPairStride = 192 + kPairRingBytes;

ShmGroup::Control& ShmGroup::control(int member) const {
  return reinterpret_cast<Control*>(base_ + control_offset_)[member];
}

char* ShmGroup::slot(int member, int buffer) const {
  return base_ + data_offset_ + (static_cast<size_t>(member) * 2 + buffer) * slot_bytes_;
}

Result<std::unique_ptr<ShmGroup>> ShmGroup::Create(store::Store& store, const std::string& prefix,
                                                   std::vector<int> ranks, int index,
                                                   size_t slot_bytes, Deadline deadline,
                                                   const std::string& job_cookie) {
  std::unique_ptr<ShmGroup> g(new ShmGroup(std::move(ranks), index, AlignUp(slot_bytes, 4096)));
  const int n = g->size();
  g->control_offset_ = AlignUp(sizeof(SegmentHeader), 64);
  g->data_offset_ = AlignUp(g->control_offset_ + sizeof(Control) * n, 4096);
  g->pairs_offset_ = g->data_offset_ + g->slot_bytes_ * 2 * n;
  g->mapped_bytes_ = g->pairs_offset_ + kPairStride * n * n;
  const std::string name_key = fmt::format("{}/shm/name", prefix);
  std::string name;
  int fd;
  // The creator's segment is unlinked on every way out of this function (an error, a
  // timeout, success once every member mapped it): a failed formation leaks nothing.
  struct Unlinker {
    std::string name;
    ~Unlinker() {
      if (!name.empty()) ::shm_unlink(name.c_str());
    }
  } unlink_at_exit;
  // Step 1.
  if (index == 0) {
    const std::string family = job_cookie.substr(0, job_cookie.find('.'));
    name = "/cohort-" + (Hex(family) && family.size() <= 64 ? family + "-" : "") + RandomHex(8);
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoStatus(fmt::format("shm_open {}", name), errno);
    unlink_at_exit.name = name;
    if (::ftruncate(fd, static_cast<off_t>(g->mapped_bytes_)) != 0) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("ftruncate shared segment", err);
    }
  } else {
    // Step 2.
    COHORT_ASSIGN_OR_RETURN(name, store.Get(name_key, deadline));
    if (!SegmentName(name)) {
      return PermissionDenied("the store names '{}' as this group's shared segment: not a "
                              "segment cohort creates; refused", name.substr(0, 100));
    }
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return ErrnoStatus(fmt::format("shm_open {}", name), errno);
    if (Status ok = CheckSegment(fd, name, g->mapped_bytes_); !ok.ok()) {
      ::close(fd);
      return ok;
    }
  }
  void* base = ::mmap(nullptr, g->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (base == MAP_FAILED) return ErrnoStatus("mmap shared segment", map_errno);
  g->base_ = static_cast<char*>(base);
  auto* header = reinterpret_cast<SegmentHeader*>(g->base_);
  if (index == 0) {
    header->members = static_cast<uint32_t>(n);
    header->slot_bytes = g->slot_bytes_;
    header->aborted.store(0);
    for (int m = 0; m < n; ++m) new (&g->control(m)) Control();
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) new (&g->pair(a, b)) PairControl();
    }
    header->magic = kMagic;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    COHORT_RETURN_IF_ERROR(store.Set(name_key, name, deadline));
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
    COHORT_RETURN_IF_ERROR(store.Wait(keys, deadline));
  }
  return g;  // (the creator's segment is unlinked here: every member has it mapped)
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
    for (int k = 0; k < size(); ++k) {
      Futex(&pair(m, k).written, FUTEX_WAKE, INT_MAX, nullptr);
      Futex(&pair(m, k).read, FUTEX_WAKE, INT_MAX, nullptr);
    }
  }
}

// The one waiting loop of the group: spin while the peer is likely running on another core
// (briefly when ranks outnumber cores: spinning would only steal the peer's time slice),
// then sleep on the futex of `word`, registered in `sleepers` so publishers wake us. Every
// 100 ms it checks the abort flag, whether `peer` is still alive, and the deadline.
template <typename Done>
Status ShmGroup::WaitUntil(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
                           const Done& done, int peer, const OpDesc& desc, Deadline deadline,
                           const char* what) {
  auto* header = reinterpret_cast<SegmentHeader*>(base_);
  for (int i = 0; i < spin_pauses_ + spin_yields_; ++i) {
    if (done(word.load(std::memory_order_acquire))) return Status::Ok();
    if (i < spin_pauses_) {
      _mm_pause();
    } else {
      sched_yield();
    }
  }
  const int32_t pid = control(peer).pid;
  for (;;) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = word.load(std::memory_order_seq_cst);
    if (!done(seen) && !header->aborted.load()) {
      int64_t ms = std::min<int64_t>(deadline.RemainingMs(), 100);
      timespec ts{ms / 1000, (ms % 1000) * 1000000};
      Futex(&word, FUTEX_WAIT, seen, &ts);
    }
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (done(word.load(std::memory_order_acquire))) return Status::Ok();
    if (header->aborted.load()) return Cancelled("{}: the communicator was aborted", desc.ToString());
    if (pid > 0 && pid != ::getpid() && !ProcessAlive(pid)) {
      return Unavailable("{}: rank {} (pid {}) exited", desc.ToString(), ranks_[peer], pid);
    }
    if (deadline.expired()) {
      return DeadlineExceeded("{}: timed out waiting for rank {} to {}", desc.ToString(),
                              ranks_[peer], what);
    }
  }
}

Status ShmGroup::WaitCounter(int member, bool arrive, uint32_t target, const OpDesc& desc,
                             Deadline deadline) {
  Control& c = control(member);
  return WaitUntil(arrive ? c.arrive : c.depart, c.sleepers,
                   [target](uint32_t v) { return Reached(v, target); }, member, desc, deadline,
                   arrive ? "arrive" : "finish the previous chunk");
}

ShmGroup::PairControl& ShmGroup::pair(int from, int to) const {
  return *reinterpret_cast<PairControl*>(base_ + pairs_offset_ +
                                         (static_cast<size_t>(from) * size() + to) * kPairStride);
}

char* ShmGroup::ring(int from, int to) const {
  return reinterpret_cast<char*>(&pair(from, to)) + 192;
}

namespace {

// Moves `bytes` through one pair's ring, for either end: `mine` is this end's counter (bytes
// written, for the sender; bytes read, for the receiver), `theirs` the other end's.
// `room(mine, theirs)` is how many bytes may move now; `copy(at, k)` moves the next k bytes
// at ring offset `at`; `wait(theirs)` returns once the other end moved on from `theirs`.
// Each move is published to the other end, woken if it sleeps.
template <typename Room, typename Copy, typename Wait>
Status MoveThroughRing(std::atomic<uint32_t>& mine, std::atomic<uint32_t>& theirs,
                       std::atomic<uint32_t>& sleepers, size_t bytes, const Room& room,
                       const Copy& copy, const Wait& wait) {
  while (bytes > 0) {
    const uint32_t m = mine.load(std::memory_order_relaxed);
    const uint32_t t = theirs.load(std::memory_order_acquire);
    const size_t can = room(m, t);
    if (can == 0) {
      COHORT_RETURN_IF_ERROR(wait(t));
      continue;
    }
    const size_t at = m % kPairRingBytes;
    const size_t k = std::min({bytes, can, kPairRingBytes - at});
    copy(at, k);
    mine.store(m + static_cast<uint32_t>(k), std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) {
      Futex(&mine, FUTEX_WAKE, INT_MAX, nullptr);
    }
    bytes -= k;
  }
  return Status::Ok();
}

}  // namespace

Status ShmGroup::Push(int to, const char* data, size_t bytes, const OpDesc& desc,
                      Deadline deadline) {
  PairControl& pc = pair(index_, to);
  char* buf = ring(index_, to);
  return MoveThroughRing(
      pc.written, pc.read, pc.sleepers, bytes,
      [](uint32_t w, uint32_t r) { return kPairRingBytes - (w - r); },
      [&](size_t at, size_t k) {
        std::memcpy(buf + at, data, k);
        data += k;
      },
      [&](uint32_t r) {
        return WaitUntil(pc.read, pc.sleepers, [r](uint32_t v) { return v != r; }, to, desc,
                         deadline, "receive");
      });
}

Status ShmGroup::Pull(int from, char* data, size_t bytes, const OpDesc& desc,
                      Deadline deadline) {
  PairControl& pc = pair(from, index_);
  const char* buf = ring(from, index_);
  return MoveThroughRing(
      pc.read, pc.written, pc.sleepers, bytes,
      [](uint32_t r, uint32_t w) { return static_cast<size_t>(w - r); },
      [&](size_t at, size_t k) {
        std::memcpy(data, buf + at, k);
        data += k;
      },
      [&](uint32_t w) {
        return WaitUntil(pc.written, pc.sleepers, [w](uint32_t v) { return v != w; }, from,
                         desc, deadline, "send");
      });
}

struct ShmMessageHeader {
  OpDesc desc;
  uint64_t bytes;
};

Status ShmGroup::Send(int to, const void* buf, size_t bytes, const OpDesc& desc,
                      Deadline deadline) {
  ShmMessageHeader h{desc, bytes};
  COHORT_RETURN_IF_ERROR(Push(to, reinterpret_cast<const char*>(&h), sizeof(h), desc, deadline));
  return Push(to, static_cast<const char*>(buf), bytes, desc, deadline);
}

Status ShmGroup::Recv(int from, void* buf, size_t bytes, const OpDesc& desc, Deadline deadline) {
  ShmMessageHeader h{};
  COHORT_RETURN_IF_ERROR(Pull(from, reinterpret_cast<char*>(&h), sizeof(h), desc, deadline));
  if (!(h.desc == desc) || h.bytes != bytes) {
    return FailedPrecondition(
        "send/recv mismatch: rank {} expects {} ({} bytes) but rank {} sent {} ({} bytes)",
        ranks_[index_], desc.ToString(), bytes, ranks_[from], h.desc.ToString(), h.bytes);
  }
  return Pull(from, static_cast<char*>(buf), bytes, desc, deadline);
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
