// Implements ExitGate (see exit_gate.h).
#include "cohort/torch/exit_gate.h"

namespace cohort::torch_backend {

ExitGate& ExitGate::Get() {
  static ExitGate* gate = new ExitGate();  // never destroyed: used until the process ends
  return *gate;
}

bool ExitGate::BeginRelease() {
  MutexLock lock(&mu_);
  if (closed_) return false;
  ++releasing_;
  return true;
}

void ExitGate::EndRelease() {
  {
    MutexLock lock(&mu_);
    --releasing_;
  }
  done_.SignalAll();
}

void ExitGate::Close(Deadline by) {
  MutexLock lock(&mu_);
  closed_ = true;
  while (releasing_ > 0) {
    if (!done_.WaitUntil(&mu_, by)) return;
  }
}

}  // namespace cohort::torch_backend
