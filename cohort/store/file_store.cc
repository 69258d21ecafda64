// Implements FileStore. Thread-safety: mu_ guards state_, offset_, aborted_ and file access;
// the lambdas run by Mutate carry COHORT_REQUIRES(mu_), which Mutate's call checks.
#include "cohort/store/file_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "cohort/net/codec.h"
#include "cohort/store/memory_store.h"

namespace cohort::store {
namespace {

constexpr uint8_t kRecordSet = 1;
constexpr uint8_t kRecordDelete = 2;

class FileLock {
 public:
  FileLock(int fd, int op) : fd_(fd) { ok_ = ::flock(fd_, op) == 0; }
  ~FileLock() {
    if (ok_) ::flock(fd_, LOCK_UN);
  }
  bool ok() const { return ok_; }

 private:
  int fd_;
  bool ok_;
};

std::string Record(uint8_t kind, std::string_view key, std::string_view value) {
  net::Writer w;
  w.U8(kind).Str(key).Str(value);
  return std::move(w.Finish());
}

}  // namespace

Result<std::unique_ptr<FileStore>> FileStore::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(fmt::format("open store file {}", path), errno);
  int ev = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return std::unique_ptr<FileStore>(new FileStore(path, fd, ev));
}

FileStore::FileStore(std::string path, int fd, int abort_fd)
    : path_(std::move(path)), fd_(fd), abort_fd_(abort_fd) {}

FileStore::~FileStore() {
  ::close(fd_);
  ::close(abort_fd_);
}

Status FileStore::CatchUp() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return ErrnoStatus("fstat store file", errno);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size <= offset_) return Status::Ok();
  std::string data(size - offset_, '\0');
  ssize_t n = ::pread(fd_, data.data(), data.size(), static_cast<off_t>(offset_));
  if (n < 0) return ErrnoStatus("read store file", errno);
  data.resize(static_cast<size_t>(n));
  size_t pos = 0;
  while (data.size() - pos >= 4) {
    uint32_t len = net::DecodeFrameLength(data.data() + pos);
    if (data.size() - pos - 4 < len) break;  // torn record: wait for the rest
    net::Reader r(std::string_view(data).substr(pos + 4, len));
    uint8_t kind;
    std::string key, value;
    if (!r.U8(&kind) || !r.Str(&key) || !r.Str(&value)) {
      return DataLoss("store file {} is corrupt at offset {}", path_, offset_ + pos);
    }
    if (kind == kRecordSet) {
      state_.Set(key, value);
    } else if (kind == kRecordDelete) {
      state_.Delete(key);
    }
    pos += 4 + len;
  }
  offset_ += pos;
  return Status::Ok();
}

Status FileStore::WriteRecords(const std::string& records) {
  if (records.empty()) return Status::Ok();
  ssize_t n = ::write(fd_, records.data(), records.size());
  if (n != static_cast<ssize_t>(records.size())) return ErrnoStatus("append store file", errno);
  return CatchUp();
}

template <typename Fn>
auto FileStore::Mutate(Fn fn) -> decltype(fn()) {
  MutexLock lock(&mu_);
  if (aborted_) return Cancelled("store aborted");
  FileLock file_lock(fd_, LOCK_EX);
  if (!file_lock.ok()) return ErrnoStatus("flock store file", errno);
  COHORT_RETURN_IF_ERROR(CatchUp());
  return fn();
}

Status FileStore::Set(std::string_view key, std::string_view value, Deadline) {
  return Mutate(
      [&]() COHORT_REQUIRES(mu_) -> Status {
        return WriteRecords(Record(kRecordSet, key, value));
      });
}

Result<int64_t> FileStore::Add(std::string_view key, int64_t delta, Deadline) {
  return Mutate([&]() COHORT_REQUIRES(mu_) -> Result<int64_t> {
    KvState scratch;
    if (const std::string* v = state_.Find(key)) scratch.Set(key, *v);
    COHORT_ASSIGN_OR_RETURN(int64_t next, scratch.Add(key, delta));
    COHORT_RETURN_IF_ERROR(WriteRecords(Record(kRecordSet, key, std::to_string(next))));
    return next;
  });
}

Result<std::string> FileStore::CompareSet(std::string_view key, std::string_view expected,
                                          std::string_view desired, Deadline) {
  return Mutate([&]() COHORT_REQUIRES(mu_) -> Result<std::string> {
    KvState scratch;
    if (const std::string* v = state_.Find(key)) scratch.Set(key, *v);
    std::string after = scratch.CompareSet(key, expected, desired);
    const std::string* before = state_.Find(key);
    if (scratch.Find(key) && (!before || *before != after)) {
      COHORT_RETURN_IF_ERROR(WriteRecords(Record(kRecordSet, key, after)));
    }
    return after;
  });
}

Result<bool> FileStore::Delete(std::string_view key, Deadline) {
  return Mutate([&]() COHORT_REQUIRES(mu_) -> Result<bool> {
    bool existed = state_.Find(key) != nullptr;
    if (existed) COHORT_RETURN_IF_ERROR(WriteRecords(Record(kRecordDelete, key, "")));
    return existed;
  });
}

Status FileStore::MultiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values, Deadline) {
  if (keys.size() != values.size()) {
    return InvalidArgument("MultiSet with {} keys and {} values", keys.size(), values.size());
  }
  return Mutate([&]() COHORT_REQUIRES(mu_) -> Status {
    std::string records;
    for (size_t i = 0; i < keys.size(); ++i) records += Record(kRecordSet, keys[i], values[i]);
    return WriteRecords(records);
  });
}

Result<bool> FileStore::CreateAll(const std::vector<std::string>& keys,
                                   const std::vector<std::string>& values, Deadline) {
  if (keys.size() != values.size()) {
    return InvalidArgument("{} keys but {} values to create", keys.size(), values.size());
  }
  return Mutate([&]() COHORT_REQUIRES(mu_) -> Result<bool> {
    KvState scratch;
    for (const auto& k : keys) {
      if (const std::string* v = state_.Find(k)) scratch.Set(k, *v);
    }
    const KvState::Created created = scratch.CreateAll(keys, values);
    if (created != KvState::Created::kWritten) return created == KvState::Created::kHeld;
    std::string records;
    for (size_t i = 0; i < keys.size(); ++i) records += Record(kRecordSet, keys[i], values[i]);
    COHORT_RETURN_IF_ERROR(WriteRecords(records));
    return true;
  });
}

Result<bool> FileStore::Check(const std::vector<std::string>& keys, Deadline) {
  return Mutate(
      [&]() COHORT_REQUIRES(mu_) -> Result<bool> { return state_.ContainsAll(keys); });
}

Result<std::vector<std::optional<std::string>>> FileStore::Peek(
    const std::vector<std::string>& keys, Deadline) {
  return Mutate([&]() COHORT_REQUIRES(mu_) -> Result<std::vector<std::optional<std::string>>> {
    return state_.Peek(keys);
  });
}

Result<int64_t> FileStore::NumKeys(Deadline) {
  return Mutate([&]() COHORT_REQUIRES(mu_) -> Result<int64_t> { return state_.size(); });
}

// Each blocking call watches the file with its own inotify instance, set up before the first
// look, so an append after any look wakes this caller, however many threads wait at once.
Status FileStore::WaitFor(const std::vector<std::string>& keys, Deadline deadline) {
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } in{::inotify_init1(IN_CLOEXEC | IN_NONBLOCK)};
  if (in.fd < 0 || ::inotify_add_watch(in.fd, path_.c_str(), IN_MODIFY) < 0) {
    return ErrnoStatus(fmt::format("inotify on {}", path_), errno);
  }
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (aborted_) return Cancelled("store aborted");
      // Drain our events before looking, so an append after this look wakes us.
      char events[4096];
      while (::read(in.fd, events, sizeof(events)) > 0) {
      }
      FileLock file_lock(fd_, LOCK_SH);
      COHORT_RETURN_IF_ERROR(CatchUp());
      if (state_.ContainsAll(keys)) return Status::Ok();
    }
    pollfd fds[2] = {{in.fd, POLLIN, 0}, {abort_fd_, POLLIN, 0}};
    int rc = ::poll(fds, 2, deadline.PollTimeoutMs());
    if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
    if (rc == 0 && deadline.expired()) return WaitTimeout(keys);
  }
}

Result<std::string> FileStore::Get(std::string_view key, Deadline deadline) {
  std::vector<std::string> keys{std::string(key)};
  COHORT_RETURN_IF_ERROR(WaitFor(keys, deadline));
  MutexLock lock(&mu_);
  const std::string* v = state_.Find(key);
  if (!v) return WaitTimeout(keys);  // deleted between the wait and the read
  return *v;
}

Status FileStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  return WaitFor(keys, deadline);
}

Result<std::vector<std::string>> FileStore::MultiGet(const std::vector<std::string>& keys,
                                                     Deadline deadline) {
  COHORT_RETURN_IF_ERROR(WaitFor(keys, deadline));
  MutexLock lock(&mu_);
  std::vector<std::string> values;
  for (const auto& k : keys) {
    const std::string* v = state_.Find(k);
    if (!v) return WaitTimeout(keys);
    values.push_back(*v);
  }
  return values;
}

void FileStore::Abort() {
  MutexLock lock(&mu_);
  aborted_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(abort_fd_, &one, sizeof(one));
}

}  // namespace cohort::store
