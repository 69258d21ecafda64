// ExitGate: lets the backend's own threads drop references that can reach Python objects
// only while the interpreter still lets them take the GIL.
//
// A tensor given to a collective may be held last by the executor's thread (the caller
// woke, returned and dropped its own references first). When the tensor has a Python
// object, freeing it takes the GIL; from the moment Python starts finalizing, a thread
// other than the main one that asks for the GIL is ended with pthread_exit, whose forced
// unwinding through a destructor (noexcept) aborts the process ("terminate called without
// an active exception") after a script that had already finished. So cohort_torch closes
// the gate from an atexit handler, which runs before that moment: releases begun finish
// first, and those asked later are skipped (the memory is the exiting process's).
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <utility>

#include "cohort/base/mutex.h"
#include "cohort/base/time.h"

namespace cohort::torch_backend {

class ExitGate {
 public:
  static ExitGate& Get();

  // True when the caller may drop its references now; it calls EndRelease when done. False
  // once the gate is closed: the caller must keep (leak) them.
  bool BeginRelease() COHORT_EXCLUDES(mu_);
  void EndRelease() COHORT_EXCLUDES(mu_);
  // Closes the gate and waits, up to `by`, for the releases begun before. The caller must
  // not hold the GIL (a release may need it).
  void Close(Deadline by) COHORT_EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar done_;  // a release ended
  bool closed_ COHORT_GUARDED_BY(mu_) = false;
  int releasing_ COHORT_GUARDED_BY(mu_) = 0;
};

// Drops `held` (anything that may own tensors) through the gate: reset to empty when it is
// open, moved to the heap and never freed when it is closed.
template <typename T>
void ReleaseThroughGate(T& held) {
  ExitGate& gate = ExitGate::Get();
  if (gate.BeginRelease()) {
    held = T();
    gate.EndRelease();
  } else {
    static_cast<void>(new T(std::move(held)));  // the process is exiting
    held = T();
  }
}

}  // namespace cohort::torch_backend
