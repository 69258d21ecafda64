// cohort_torch._C's snapshots (train/snapshot_store.h) for cohort_torch/checkpoint.py: a
// SnapshotStore whose Take copies a list of CPU byte tensors into the staging slot (with
// the GIL released: the copy is the only part training waits for), and NewestSnapshot's
// answer, its payload a buffer over the mapped file. Thread-safety: a Snapshots object belongs to the
// Python thread that made it; its persister thread is internal.
#include "cohort/torch/snapshots.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>

#include "cohort/train/checkpoint_file.h"
#include "cohort/train/snapshot_store.h"

namespace py = pybind11;

namespace cohort::torch_backend {
namespace {

using train::SnapshotStore;

void Check(const Status& st) {
  if (!st.ok()) throw std::runtime_error(st.ToString());
}

void BindFoundSnapshot(py::module_& m);

}  // namespace

void BindSnapshots(py::module_& m) {
  py::class_<SnapshotStore>(m, "Snapshots")
      .def(py::init([](const std::string& memory_dir, const std::string& disk_dir, int keep,
                       int rank) {
             return std::make_unique<SnapshotStore>(SnapshotStore::Options{
                 .memory_dir = memory_dir, .disk_dir = disk_dir, .keep = keep, .rank = rank});
           }),
           py::arg("memory_dir"), py::arg("disk_dir"), py::arg("keep"), py::arg("rank"))
      .def(
          "take",
          [](SnapshotStore& store, int64_t step, const std::string& meta,
             const std::vector<at::Tensor>& tensors) {
            std::vector<size_t> sizes;
            for (const auto& t : tensors) {
              if (!t.device().is_cpu() || !t.is_contiguous() || t.scalar_type() != at::kByte) {
                throw py::value_error("snapshot tensors must be contiguous uint8 CPU tensors");
              }
              sizes.push_back(t.nbytes());
            }
            size_t total = 0;
            const std::vector<size_t> offsets = train::AlignedOffsets(sizes, &total);
            std::vector<train::PayloadPiece> pieces;
            for (size_t i = 0; i < tensors.size(); ++i) {
              pieces.push_back({tensors[i].data_ptr(), sizes[i], offsets[i]});
            }
            Status taken;
            {
              py::gil_scoped_release release;  // the copy: all that training waits for
              taken = store.Take(step, meta, total, [&](char* payload, uint32_t crc) {
                return train::FillPayload(pieces, total, payload, crc);
              });
            }
            Check(taken);
            return py::make_tuple(offsets, total);
          },
          py::arg("step"), py::arg("meta"), py::arg("tensors"),
          "Copies the tensors into a snapshot of `step` and publishes it; returns their "
          "payload offsets and the payload's size.")
      .def(
          "flush",
          [](SnapshotStore& store, double timeout_s) {
            py::gil_scoped_release release;
            Check(store.Flush(Deadline::AfterMs(static_cast<int64_t>(timeout_s * 1000))));
          },
          py::arg("timeout_s"), "Waits until the newest snapshot is in the directory.")
      .def("stats", [](const SnapshotStore& store) {
        const train::SnapshotStats s = store.stats();
        py::dict d;
        d["taken"] = s.taken;
        d["persisted"] = s.persisted;
        d["dropped"] = s.dropped;
        d["write_failures"] = s.write_failures;
        d["in_process"] = s.in_process;
        d["last_step"] = s.last_step;
        d["persisted_step"] = s.persisted_step;
        d["blocking_seconds"] = s.blocking_seconds;
        d["last_blocking_seconds"] = s.last_blocking_seconds;
        return d;
      });
  BindFoundSnapshot(m);
}

namespace {

// NewestSnapshot's answer: the snapshot found, its payload a buffer over the mapped file.
void BindFoundSnapshot(py::module_& m) {
  // The found snapshot's payload, readable as a buffer (memoryview) that keeps the mapping.
  struct Payload {
    std::shared_ptr<const train::MappedFile> file;
    std::string_view bytes;
  };
  py::class_<Payload>(m, "SnapshotPayload", py::buffer_protocol())
      .def_buffer([](Payload& p) {
        return py::buffer_info(const_cast<char*>(p.bytes.data()), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(p.bytes.size())}, {1},
                               /*readonly=*/true);
      });
  py::class_<train::FoundSnapshot>(m, "FoundSnapshot")
      .def_readonly("step", &train::FoundSnapshot::step)
      .def_readonly("where", &train::FoundSnapshot::where)
      .def_readonly("path", &train::FoundSnapshot::path)
      .def_property_readonly("meta",
                             [](const train::FoundSnapshot& f) {
                               return py::bytes(f.view.meta.data(), f.view.meta.size());
                             })
      .def_property_readonly(
          "payload",
          [](const train::FoundSnapshot& f) { return Payload{f.file, f.view.payload}; },
          "The payload, mapped (no copy): copy what you keep, then recheck().")
      .def(
          "recheck", [](const train::FoundSnapshot& f) { Check(f.Recheck()); },
          py::call_guard<py::gil_scoped_release>(),
          "Raises if the file changed since it was verified (its writer reused it).");
  m.def(
      "newest_snapshot",
      [](const std::string& memory_dir, const std::string& disk_dir) -> py::object {
        Result<train::FoundSnapshot> found = [&] {
          py::gil_scoped_release release;
          return train::NewestSnapshot(memory_dir, disk_dir);
        }();
        if (!found.ok()) {
          if (found.status().code() == StatusCode::kNotFound) return py::none();
          throw std::runtime_error(found.status().ToString());
        }
        return py::cast(std::move(*found));
      },
      py::arg("memory_dir"), py::arg("disk_dir"),
      "The newest valid snapshot or checkpoint on this node (a FoundSnapshot, mapped), or "
      "None.");
}

}  // namespace

}  // namespace cohort::torch_backend
