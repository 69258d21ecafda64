// FileStore: a Store shared by processes on one machine (or a shared file system) through
// one append-only file. Each mutation appends a record under an exclusive flock(2); readers
// replay new records under a shared lock. Blocking calls sleep on inotify for the file and
// wake when a writer appends, with the deadline as the poll timeout.
//
// Record format: [u32 body length][u8 kind (1 = set, 2 = delete)][str key][str value], the
// same little-endian encoding as the TCP protocol. A torn record at the end (a writer that
// died mid-write) is ignored until it is complete.
//
// Thread-safety: all methods are safe from any thread (mu_ serializes them in-process and
// guards the replayed state, the replay offset and the aborted flag; each blocking call has
// its own inotify watch, so concurrent waiters all wake).
#pragma once

#include <string>

#include "cohort/base/mutex.h"
#include "cohort/store/kv_state.h"
#include "cohort/store/store.h"

namespace cohort::store {

class FileStore final : public Store {
 public:
  static Result<std::unique_ptr<FileStore>> Open(const std::string& path);
  ~FileStore() override;

  COHORT_STORE_METHODS(override);  // the Store interface (store.h)
  // In one step, under the file lock (KvState::CreateAll).
  Result<bool> CreateAll(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values, Deadline deadline) override;

 private:
  FileStore(std::string path, int fd, int abort_fd);
  // Replays records appended since the last read. Caller holds mu_ and a file lock.
  Status CatchUp() COHORT_REQUIRES(mu_);
  // Runs `fn` with mu_ held and the file locked exclusively, state caught up; fn appends
  // what it changes. `fn` is a lambda annotated COHORT_REQUIRES(mu_).
  template <typename Fn>
  COHORT_EXCLUDES(mu_) auto Mutate(Fn fn) -> decltype(fn());
  // Appends `records` and replays them. Caller holds mu_ and the exclusive file lock.
  Status WriteRecords(const std::string& records) COHORT_REQUIRES(mu_);
  Status WaitFor(const std::vector<std::string>& keys, Deadline deadline) COHORT_EXCLUDES(mu_);

  const std::string path_;
  const int fd_;
  const int abort_fd_;  // eventfd written by Abort()
  Mutex mu_;
  KvState state_ COHORT_GUARDED_BY(mu_);
  uint64_t offset_ COHORT_GUARDED_BY(mu_) = 0;  // bytes of the file replayed into state_
  bool aborted_ COHORT_GUARDED_BY(mu_) = false;
};

}  // namespace cohort::store
