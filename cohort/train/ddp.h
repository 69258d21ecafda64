// DistributedDataParallel: data-parallel gradient averaging for a torch::nn::Module over a
// cohort::comm::Communicator, overlapped with backward.
//
//   auto ddp = DistributedDataParallel::Create(model, comm.get(), {}).value();
//   loss = loss_fn(model->forward(x), y); loss.backward();
//   Status synced = ddp->FinishGradientSync();      // before optimizer.step()
//   optimizer.step();
//
// Protocol, per step:
//   1. At construction every parameter and buffer is broadcast from rank 0, and the
//      parameters that require grad are assigned to buckets in reverse registration order
//      (the order backward usually produces them): the first bucket holds ~first_bucket_bytes,
//      the others ~bucket_bytes, and a bucket never mixes dtypes. The layout depends only on
//      the module, so it is the same on every rank.
//   2. A post hook on each parameter's gradient accumulator marks the parameter ready once its
//      .grad holds this step's (possibly accumulated) value, and copies it into its bucket's
//      flat buffer.
//   3. When every parameter of a bucket is ready the bucket is launched: an asynchronous
//      AllReduce(kAvg) of the flat buffer (converted to bf16 or fp16 first with compression).
//      Buckets are launched strictly in index order, so every rank issues the same
//      collectives in the same order even if autograd finishes them in another order.
//   4. FinishGradientSync() treats parameters that got no gradient as zero (so the
//      collectives still match on every rank), launches the remaining buckets, waits for
//      every Work handle, and copies the averaged gradients back into each .grad. Unused
//      parameters are an error unless find_unused_parameters, in which case they are
//      reported once.
// Inside a NoSync scope the hooks do nothing and FinishGradientSync() returns at once, so
// gradients accumulate locally; the first synchronised backward after it averages the sum.
//
// Thread-safety: not thread-safe; use from the thread that runs forward/backward (the CPU
// autograd engine runs hooks on that thread). The communicator's worker thread only
// touches the flat buffers of launched buckets until FinishGradientSync waits for them.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/comm/communicator.h"

namespace cohort::train {

// Gradients may travel in 16 bits: half the bytes, rounded once per bucket.
enum class GradCompression { kNone, kBf16, kFp16 };

struct DdpOptions {
  size_t first_bucket_bytes = 1 << 20;
  size_t bucket_bytes = 25 << 20;
  GradCompression compression = GradCompression::kNone;
  bool find_unused_parameters = false;  // zero-fill and report instead of failing
  std::chrono::milliseconds timeout{300000};  // per wait on a bucket
};

struct DdpStats {
  int64_t syncs = 0;             // FinishGradientSync calls that reduced
  double comm_wait_seconds = 0;  // time FinishGradientSync blocked on communication
  double last_wait_seconds = 0;
  int64_t bytes_reduced = 0;     // payload bytes handed to AllReduce
};

class DistributedDataParallel {
 public:
  // `comm` may be null (one process): then nothing is broadcast or reduced. The module and
  // communicator must outlive the returned object.
  static Result<std::unique_ptr<DistributedDataParallel>> Create(
      std::shared_ptr<torch::nn::Module> module, comm::Communicator* comm,
      DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() { return *module_; }
  int rank() const;
  int world_size() const;

  // After backward, before optimizer.step(): see the protocol above.
  Status FinishGradientSync();
  // Broadcasts buffers (BatchNorm running statistics) from rank 0.
  Status SyncBuffers();

  // RAII: gradient accumulation without communication while alive.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.no_sync_) {
      ddp_.no_sync_ = true;
    }
    ~NoSync() { ddp_.no_sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };

  const DdpStats& stats() const { return stats_; }
  // Parameter names of each bucket, in launch order (for tests and logs).
  std::vector<std::vector<std::string>> BucketLayout() const;

 private:
  struct Param {
    std::string name;
    torch::Tensor tensor;
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive so hooks persist
    uintptr_t hook_key = 0;
    size_t bucket = 0;
    int64_t offset = 0;  // in elements, into the bucket's flat buffer
    bool ready = false;
  };
  struct Bucket {
    std::vector<size_t> params;
    torch::Tensor flat;      // gradient dtype, contiguous
    torch::Tensor wire;      // what goes over the communicator (flat, or its 16-bit copy)
    size_t pending = 0;      // parameters not ready yet this step
    comm::Communicator::WorkPtr work;
  };

  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, comm::Communicator* comm,
                          DdpOptions options);
  Status BroadcastState();
  void BuildBuckets();
  void RegisterHooks();
  void MarkReady(size_t index);
  void LaunchReadyBuckets();
  void Launch(Bucket& bucket);
  void ResetStep();

  std::shared_ptr<torch::nn::Module> module_;
  comm::Communicator* comm_;
  DdpOptions options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  bool no_sync_ = false;
  bool unused_reported_ = false;
  Status step_error_;
  std::shared_ptr<bool> alive_;  // hooks hold a weak_ptr: no calls after destruction
  DdpStats stats_;
};

}  // namespace cohort::train
