// cohort_torch._C's snapshot bindings (snapshots.cc): Snapshots (train/snapshot_store.h)
// and newest_snapshot, for cohort_torch/checkpoint.py. Thread-safety: see snapshots.cc.
#pragma once

#include <pybind11/pybind11.h>

namespace cohort::torch_backend {

void BindSnapshots(pybind11::module_& m);

}  // namespace cohort::torch_backend
