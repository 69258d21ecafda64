// The Python extension cohort_torch._C: the creator of "cohort" process groups that
// cohort_torch/__init__.py registers with torch.distributed. Built against Debian's torch
// 1.13 and pybind11 2.10 (whose internals match libtorch_python's), so torch's own Store
// and ProcessGroup types cross the boundary unchanged.
// Thread-safety: the creator runs with the GIL released (it may wait for peers).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "cohort/base/membership_channel.h"
#include "cohort/base/worker_env.h"
#include "cohort/torch/exit_gate.h"
#include "cohort/torch/process_group.h"
#include "cohort/torch/progress.h"
#include "cohort/torch/snapshots.h"

namespace py = pybind11;

namespace {

cohort::torch_backend::CohortProcessGroup& CohortGroup(
    const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  auto* cohort = dynamic_cast<cohort::torch_backend::CohortProcessGroup*>(pg.get());
  if (!cohort) throw py::value_error("not a process group of the cohort backend");
  return *cohort;
}

void Check(const cohort::Status& st) {
  if (!st.ok()) throw std::runtime_error(st.ToString());
}

// The membership channel (base/membership_channel.h) for cohort_torch/live.py: the same
// files and format as the agent and libcohort use.
void BindChannel(py::module_& m) {
  namespace mc = cohort::membership_channel;
  m.def(
      "read_notice",
      [](const std::string& dir, int local_rank, const std::string& secret) -> py::object {
        auto n = mc::ReadNotice(dir, local_rank, secret);
        if (!n.ok()) {
          if (n.status().code() == cohort::StatusCode::kNotFound) return py::none();
          throw std::runtime_error(n.status().ToString());
        }
        // The notice's fields as the channel's file has them (MembershipNotice::ToJson).
        py::dict d = py::module_::import("json").attr("loads")(n->ToJson());
        py::dict env;  // what the worker sets in its own environment (worker_env.h)
        for (const auto& [name, value] : cohort::ReformedEnvironment(*n)) env[py::str(name)] = value;
        d["environment"] = env;
        return d;
      },
      py::arg("dir"), py::arg("local_rank"), py::arg("secret"),
      "The agent's newest membership notice for this worker, or None; raises when the "
      "directory is not private to this user or the notice lacks the agent's secret.");
  m.def("mark_ready", [](const std::string& dir, int local) { Check(mc::MarkReady(dir, local)); },
        py::arg("dir"), py::arg("local_rank"), "Declares that this worker re-forms in place.");
  m.def(
      "write_formed",
      [](const std::string& dir, int local, int64_t round) {
        Check(mc::WriteFormed(dir, local, round));
      },
      py::arg("dir"), py::arg("local_rank"), py::arg("round"),
      "Tells the agent the worker formed its group in `round`.");
  m.def(
      "write_lost",
      [](const std::string& dir, int local, int64_t round, int rank, const std::string& why,
         const std::string& secret) {
        Check(mc::WriteLost(dir, local,
                            cohort::LostPeerReport{round, rank, why, cohort::LostPeerIn(why)},
                            secret));
      },
      py::arg("dir"), py::arg("local_rank"), py::arg("round"), py::arg("rank"),
      py::arg("reason"), py::arg("secret"), "Tells the agent a collective of `round` failed: a peer went away.");
  // The worker contract's names (base/worker_env.h), so the Python side spells none.
  py::dict names;
  for (const auto& [key, name] : cohort::worker_env::PythonNames()) names[key] = name;
  m.attr("WORKER_ENV") = names;
}

}  // namespace

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
        return CohortGroup(pg).topology();
      },
      py::arg("group"), "How the group's ranks reach each other: shm, tcp or shm+tcp.");
  m.def(
      "interrupt",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& why) {
        CohortGroup(pg).Interrupt(why);
      },
      py::arg("group"), py::arg("why"), py::call_guard<py::gil_scoped_release>(),
      "Fails the group's pending operations ('membership changed: <why>') and closes its "
      "connections: a rank blocked on a peer that left returns at once.");
  m.def(
      "close_at_exit",
      [] { cohort::torch_backend::ExitGate::Get().Close(cohort::Deadline::AfterMs(5000)); },
      py::call_guard<py::gil_scoped_release>(),
      "From atexit: the backend's threads stop freeing tensors (a free may need the GIL, "
      "which the interpreter stops lending once it finalizes); waits up to 5 s for frees "
      "begun.");
  BindChannel(m);
  cohort::torch_backend::BindSnapshots(m);
  m.def(
      "report",
      [](std::optional<int64_t> step, std::optional<double> loss, std::optional<double> samples,
         std::optional<double> epoch, const std::string& tensorboard_dir) {
        cohort::torch_backend::Report({step, loss, samples, epoch, tensorboard_dir});
      },
      py::arg("step") = py::none(), py::arg("loss") = py::none(),
      py::arg("samples") = py::none(), py::arg("epoch") = py::none(),
      py::arg("tensorboard_dir") = "",
      "Records the loop's progress for the agent's views (and TensorBoard): see "
      "cohort_torch.report.");
}
