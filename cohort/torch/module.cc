// The Python extension cohort_torch._C: the creator of "cohort" process groups that
// cohort_torch/__init__.py registers with torch.distributed. Built against Debian's torch
// 1.13 and pybind11 2.10 (whose internals match libtorch_python's), so torch's own Store
// and ProcessGroup types cross the boundary unchanged.
// Thread-safety: the creator runs with the GIL released (it may wait for peers).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "cohort/torch/process_group.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "libcohort collectives as the torch.distributed backend 'cohort'";
  m.def("create_process_group", &cohort::torch_backend::CreateProcessGroup, py::arg("store"),
        py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
        py::call_guard<py::gil_scoped_release>(),
        "Joins the group through torch's store; what torch.distributed calls for "
        "init_process_group('cohort') and new_group(backend='cohort').");
  m.def(
      "topology",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) -> std::string {
        auto* cohort = dynamic_cast<cohort::torch_backend::CohortProcessGroup*>(pg.get());
        if (!cohort) throw py::value_error("not a process group of the cohort backend");
        return cohort->topology();
      },
      py::arg("group"), "How the group's ranks reach each other: shm, tcp or shm+tcp.");
}
