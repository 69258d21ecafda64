// FileStore: a Store shared by processes on one machine (or a shared file system) through
// one append-only file. Each mutation appends a record under an exclusive flock(2); readers
// replay new records under a shared lock. Blocking calls sleep on inotify for the file and
// wake when a writer appends, with the deadline as the poll timeout.
//
// Record format: [u32 body length][u8 kind (1 = set, 2 = delete)][str key][str value], the
// same little-endian encoding as the TCP protocol. A torn record at the end (a writer that
// died mid-write) is ignored until it is complete.
//
// Thread-safety: all methods are safe from any thread (a mutex serializes them in-process;
// each blocking call has its own inotify watch, so concurrent waiters all wake).
#pragma once

#include <mutex>
#include <string>

#include "cohort/store/kv_state.h"
#include "cohort/store/store.h"

namespace cohort::store {

class FileStore final : public Store {
 public:
  static Result<std::unique_ptr<FileStore>> Open(const std::string& path);
  ~FileStore() override;

  COHORT_STORE_METHODS(override);  // the Store interface (store.h)

 private:
  FileStore(std::string path, int fd, int abort_fd);
  // Replays records appended since the last read. Caller holds mu_ and a file lock.
  Status CatchUp();
  // Runs `fn` with the file locked exclusively, state caught up; appends what fn returns.
  template <typename Fn>
  auto Mutate(Fn fn) -> decltype(fn());
  Status Append(const std::string& records);
  Status WaitFor(const std::vector<std::string>& keys, Deadline deadline);

  const std::string path_;
  const int fd_;
  const int abort_fd_;  // eventfd written by Abort()
  std::mutex mu_;
  KvState state_;
  uint64_t offset_ = 0;  // bytes of the file replayed into state_
  bool aborted_ = false;
};

}  // namespace cohort::store
