// CohortProcessGroup: libcohort as a torch.distributed backend ("cohort") for the PyTorch
// that Debian ships (1.13). `import cohort_torch` registers it; see docs/torch-backend.md.
//
// Every operation returns a CohortWork at once and runs on the group's "pg-worker" thread,
// in issue order, without the GIL (the worker never runs Python code of its own). A caller
// that waits for an operation which is next in line and not started yet runs it itself
// instead of waiting for the worker to wake (a synchronous call then costs no thread
// hand-off; the order is the same). A failure (a dead peer,
// mismatched collectives, the group's timeout) completes the Work and its future with a
// RuntimeError that names this rank and the operation; the communicator is then broken and
// every later operation fails at once with the first error.
//
// Thread-safety: operations may be issued from any thread (issue order = the order in which
// they take the queue lock); the worker thread owns the communicator's use.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "cohort/base/mutex.h"
#include "cohort/base/time.h"
#include "cohort/comm/communicator.h"

namespace cohort::torch_backend {

class CohortWork;

// A group's operations in issue order, and the thread that runs them.
class Executor {
 public:
  using Task = std::function<void()>;  // throws on failure
  Executor();
  ~Executor();  // Stop()
  void Push(c10::intrusive_ptr<CohortWork> work, Task task);  // throws when stopping
  // Runs `work` on the calling thread when it is next and nothing is running; false if not.
  bool RunIfNext(const CohortWork* work);
  // Refuses new work, lets the worker finish the queue and waits for any helper.
  void Stop();
  bool idle();
  uint64_t issued();

 private:
  using Item = std::pair<c10::intrusive_ptr<CohortWork>, Task>;
  void Loop();
  // Runs the item's task (outside autograd); its error, if any.
  static std::exception_ptr Run(Item& item);
  // Runs an item taken from the queue (running_ set), completes its work, then lets the
  // next one go.
  void RunTaken(Item& item) COHORT_EXCLUDES(mu_);
  Mutex mu_;
  CondVar cv_;  // an item was queued or finished, or the executor stops
  std::deque<Item> queue_ COHORT_GUARDED_BY(mu_);
  bool running_ COHORT_GUARDED_BY(mu_) = false;  // an item is being run (worker or helper)
  // Communication wait, for /metrics and the dashboard: each time the queue drains, the
  // time since the last operation was issued (what a caller that waits for its last
  // collective, as DDP does at the end of backward, or a synchronous call, waits); added
  // to one process-wide meter (all groups).
  SteadyClock::time_point last_push_ COHORT_GUARDED_BY(mu_);
  bool stopping_ COHORT_GUARDED_BY(mu_) = false;
  uint64_t issued_ COHORT_GUARDED_BY(mu_) = 0;
  std::thread worker_;  // started by the constructor, joined by Stop
};

class CohortWork final : public c10d::Work {
 public:
  CohortWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
             std::weak_ptr<Executor> executor);
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  bool wait(std::chrono::milliseconds timeout) override;
  // Called once, by whoever ran the operation.
  void Complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::weak_ptr<Executor> executor_;
};

class CohortProcessGroup final : public c10d::ProcessGroup {
 public:
  // Joins the group through `store` (torch's, already prefixed per group); throws
  // std::runtime_error naming what failed. `timeout` bounds every operation.
  CohortProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  ~CohortProcessGroup() override;

  const std::string getBackendName() const override { return "cohort"; }
  // "shm", "tcp" or "shm+tcp".
  std::string topology() const { return comm_->topology(); }
  // Live reconfiguration: fails what is pending with "membership changed: <why>" and
  // closes the group's connections (Communicator::Interrupt); any thread.
  void Interrupt(std::string_view why) { comm_->Interrupt(why); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return executor_->issued(); }

 private:
  c10::intrusive_ptr<c10d::Work> Enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         Executor::Task task);
  // Runs one all-to-all whose blocks differ in size: `send_counts[j]` elements of `in`
  // (blocks laid end to end) go to rank j and `recv_counts[j]` come from it into `out`.
  void UnevenAllToAll(const at::Tensor& in, const std::vector<int64_t>& send_counts,
                      at::Tensor& out, const std::vector<int64_t>& recv_counts);
  // gather's outputs or scatter's inputs: one tensor per rank like `like` on the root,
  // none elsewhere (checked, as is the root).
  std::vector<at::Tensor> RootList(const std::vector<std::vector<at::Tensor>>& lists,
                                   int64_t root, const at::Tensor& like, const char* op,
                                   const char* which) const;

  std::shared_ptr<store::Store> store_;  // torch's store, adapted; kept for the group's life
  std::unique_ptr<comm::Communicator> comm_;
  std::shared_ptr<Executor> executor_;  // works hold it weakly, to help in wait()
};

// The creator torch calls for init_process_group("cohort") and new_group(backend="cohort").
c10::intrusive_ptr<c10d::ProcessGroup> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<double> timeout);

}  // namespace cohort::torch_backend
