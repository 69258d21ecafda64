// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with Clang's
// thread-safety annotations, so that a field marked COHORT_GUARDED_BY(mu_) is checked at
// compile time to be touched only with mu_ held (tools/thread-safety-check.sh builds the
// annotated sources with -Wthread-safety -Werror; GCC ignores the annotations).
//
//   class Queue {
//     void Push(int v) COHORT_EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       items_.push_back(v);
//       cv_.SignalAll();
//     }
//     Mutex mu_;
//     CondVar cv_;
//     std::deque<int> items_ COHORT_GUARDED_BY(mu_);
//   };
//
// Waiting: write the loop out, `while (!ready_) cv_.Wait(&mu_);`, so the analysis sees
// the condition read under the lock (a predicate lambda hides it).
//
// Thread-safety: these are the synchronisation primitives; a Mutex is not recursive.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "cohort/base/time.h"

#if defined(__clang__)
#define COHORT_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define COHORT_THREAD_ANNOTATION(x)
#endif

#define COHORT_CAPABILITY(name) COHORT_THREAD_ANNOTATION(capability(name))
#define COHORT_SCOPED_CAPABILITY COHORT_THREAD_ANNOTATION(scoped_lockable)
#define COHORT_GUARDED_BY(mu) COHORT_THREAD_ANNOTATION(guarded_by(mu))
#define COHORT_PT_GUARDED_BY(mu) COHORT_THREAD_ANNOTATION(pt_guarded_by(mu))
#define COHORT_REQUIRES(...) COHORT_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define COHORT_ACQUIRE(...) COHORT_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define COHORT_RELEASE(...) COHORT_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define COHORT_EXCLUDES(...) COHORT_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define COHORT_ASSERT_HELD(mu) COHORT_THREAD_ANNOTATION(assert_capability(mu))
#define COHORT_NO_THREAD_SAFETY_ANALYSIS COHORT_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace cohort {

class COHORT_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() COHORT_ACQUIRE() { mu_.lock(); }
  void Unlock() COHORT_RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds the lock (for code it cannot follow).
  void AssertHeld() const COHORT_ASSERT_HELD(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class COHORT_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) COHORT_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() COHORT_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Releases `mu`, waits for a signal (or a spurious wake-up), holds `mu` again.
  void Wait(Mutex* mu) COHORT_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's MutexLock releases it
  }
  // As Wait, until `deadline` at the latest; false when it has passed.
  bool WaitUntil(Mutex* mu, Deadline deadline) COHORT_REQUIRES(mu) {
    if (deadline.infinite()) {
      Wait(mu);
      return true;
    }
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline.time()) == std::cv_status::no_timeout;
    lock.release();
    return woken || !deadline.expired();
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace cohort
