// DistributedDataParallel (see ddp.h for the protocol). Thread-safety: single owner thread.
#include "cohort/train/ddp.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>

#include "cohort/base/log.h"

namespace cohort::train {
namespace {

Result<comm::DataType> CommType(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32: return comm::DataType::kF32;
    case torch::kFloat64: return comm::DataType::kF64;
    case torch::kFloat16: return comm::DataType::kF16;
    case torch::kBFloat16: return comm::DataType::kBF16;
    case torch::kInt8: return comm::DataType::kI8;
    case torch::kUInt8: return comm::DataType::kU8;
    case torch::kInt32: return comm::DataType::kI32;
    case torch::kInt64: return comm::DataType::kI64;
    case torch::kBool: return comm::DataType::kU8;
    default: return InvalidArgument("dtype {} cannot be communicated", c10::toString(t));
  }
}

// Broadcasts `t` from rank 0 in place (through a contiguous copy when needed).
Status BroadcastTensor(comm::Communicator& comm, torch::Tensor t, const std::string& name,
                       std::chrono::milliseconds timeout) {
  COHORT_ASSIGN_OR_RETURN(comm::DataType dt, CommType(t.scalar_type()));
  torch::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  Status st = comm.Broadcast(buf.data_ptr(), static_cast<size_t>(buf.numel()), dt, 0)
                  ->Wait(Deadline::After(timeout));
  if (!st.ok()) return st.WithContext("broadcast of " + name);
  if (!buf.is_same(t)) t.copy_(buf);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::Create(
    std::shared_ptr<torch::nn::Module> module, comm::Communicator* comm, DdpOptions options) {
  std::unique_ptr<DistributedDataParallel> ddp(
      new DistributedDataParallel(std::move(module), comm, options));
  if (comm != nullptr && comm->size() > 1) {
    COHORT_RETURN_IF_ERROR(ddp->BroadcastState());
    ddp->BuildBuckets();
    ddp->RegisterHooks();
    if (comm->rank() == 0) {
      COHORT_LOG_INFO("train", "ddp: {} parameters in {} buckets over {} ranks ({}){}",
                      ddp->params_.size(), ddp->buckets_.size(), comm->size(),
                      comm->topology(),
                      options.compression == GradCompression::kBf16   ? ", bf16 gradients"
                      : options.compression == GradCompression::kFp16 ? ", fp16 gradients"
                                                                      : "");
    }
  }
  return ddp;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 comm::Communicator* comm, DdpOptions options)
    : module_(std::move(module)), comm_(comm), options_(options) {}

DistributedDataParallel::~DistributedDataParallel() {
  // A failed or abandoned step may leave work in flight that points into our buffers.
  for (auto& b : buckets_) {
    if (b.work) (void)b.work->Wait(Deadline::After(options_.timeout));
  }
  for (auto& p : params_) {
    if (p.accumulator && p.hook_key != 0) p.accumulator->del_post_hook(p.hook_key);
  }
}

int DistributedDataParallel::rank() const { return comm_ ? comm_->rank() : 0; }
int DistributedDataParallel::world_size() const { return comm_ ? comm_->size() : 1; }

Status DistributedDataParallel::BroadcastState() {
  torch::NoGradGuard no_grad;
  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    COHORT_RETURN_IF_ERROR(BroadcastTensor(*comm_, item.value(), item.key(), options_.timeout));
  }
  return SyncBuffers();
}

Status DistributedDataParallel::SyncBuffers() {
  if (comm_ == nullptr || comm_->size() == 1) return Status::Ok();
  torch::NoGradGuard no_grad;
  for (auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (!item.value().defined()) continue;
    COHORT_RETURN_IF_ERROR(BroadcastTensor(*comm_, item.value(), item.key(), options_.timeout));
  }
  return Status::Ok();
}

void DistributedDataParallel::BuildBuckets() {
  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    Param p;
    p.name = item.key();
    p.tensor = item.value();
    params_.push_back(std::move(p));
  }
  // Reverse registration order; a new bucket when the size cap is reached or the dtype
  // changes.
  size_t cap = options_.first_bucket_bytes;
  size_t bytes = 0;
  torch::ScalarType dtype = torch::kFloat32;
  for (size_t k = params_.size(); k-- > 0;) {
    Param& p = params_[k];
    size_t pbytes = static_cast<size_t>(p.tensor.numel()) * p.tensor.element_size();
    bool new_bucket = buckets_.empty() || p.tensor.scalar_type() != dtype ||
                      (bytes > 0 && bytes + pbytes > cap);
    if (new_bucket) {
      if (!buckets_.empty()) cap = options_.bucket_bytes;
      buckets_.emplace_back();
      bytes = 0;
      dtype = p.tensor.scalar_type();
    }
    Bucket& b = buckets_.back();
    p.bucket = buckets_.size() - 1;
    p.offset = 0;
    for (size_t q : b.params) p.offset += params_[q].tensor.numel();
    b.params.push_back(k);
    bytes += pbytes;
  }
  for (auto& b : buckets_) {
    int64_t n = 0;
    for (size_t q : b.params) n += params_[q].tensor.numel();
    b.flat = torch::zeros({n}, params_[b.params[0]].tensor.options().requires_grad(false));
    if (options_.compression == GradCompression::kNone) {
      b.wire = b.flat;
    } else {
      auto wire_type = options_.compression == GradCompression::kBf16 ? torch::kBFloat16
                                                                      : torch::kFloat16;
      b.wire = torch::zeros({n}, b.flat.options().dtype(wire_type));
    }
    b.pending = b.params.size();
  }
}

void DistributedDataParallel::RegisterHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
    COHORT_CHECK(p.accumulator != nullptr) << p.name << " is not a leaf that requires grad";
    p.hook_key = p.accumulator->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
              MarkReady(i);
              return outputs;
            }));
  }
}

void DistributedDataParallel::MarkReady(size_t index) {
  if (no_sync_) return;
  Param& p = params_[index];
  if (p.ready) {
    if (step_error_.ok()) {
      step_error_ = FailedPrecondition(
          "parameter {} got a gradient twice in one step: call FinishGradientSync() after "
          "each backward (or use NoSync for accumulation)", p.name);
    }
    return;
  }
  Bucket& b = buckets_[p.bucket];
  torch::NoGradGuard no_grad;
  const torch::Tensor& grad = p.tensor.grad();
  auto slot = b.flat.narrow(0, p.offset, p.tensor.numel());
  if (grad.defined()) {
    slot.copy_(grad.reshape({-1}));
  } else {
    slot.zero_();
  }
  p.ready = true;
  if (--b.pending == 0) LaunchReadyBuckets();
}

void DistributedDataParallel::LaunchReadyBuckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Launch(buckets_[next_launch_++]);
  }
}

void DistributedDataParallel::Launch(Bucket& b) {
  torch::NoGradGuard no_grad;
  if (options_.compression != GradCompression::kNone) b.wire.copy_(b.flat);
  auto dt = CommType(b.wire.scalar_type());
  COHORT_CHECK(dt.ok()) << dt.status().ToString();
  b.work = comm_->AllReduce(b.wire.data_ptr(), b.wire.data_ptr(),
                            static_cast<size_t>(b.wire.numel()), *dt, comm::ReduceOp::kAvg,
                            comm::Exec::kAsync);
  stats_.bytes_reduced += b.wire.numel() * b.wire.element_size();
}

void DistributedDataParallel::ResetStep() {
  for (auto& p : params_) p.ready = false;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  next_launch_ = 0;
  step_error_ = Status::Ok();
}

Status DistributedDataParallel::FinishGradientSync() {
  if (comm_ == nullptr || comm_->size() == 1 || no_sync_) return Status::Ok();
  // 1. Parameters without a gradient this step count as zero so every rank launches every
  //    bucket; remember them for the report.
  std::vector<std::string> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].ready) {
      unused.push_back(params_[i].name);
      MarkReady(i);  // zero-fills the slot when .grad is undefined, else uses .grad as is
    }
  }
  LaunchReadyBuckets();
  COHORT_CHECK(next_launch_ == buckets_.size()) << next_launch_ << " of " << buckets_.size();
  // 2. Wait for every bucket, timing the wait.
  auto start = SteadyClock::now();
  Status first_error;
  for (auto& b : buckets_) {
    Status st = b.work->Wait(Deadline::After(options_.timeout));
    if (!st.ok() && first_error.ok()) first_error = st.WithContext("gradient allreduce");
  }
  stats_.last_wait_seconds = SecondsSince(start);
  stats_.comm_wait_seconds += stats_.last_wait_seconds;
  ++stats_.syncs;
  if (!first_error.ok()) {
    ResetStep();
    return first_error;
  }
  // 3. Copy the averages back into .grad.
  {
    torch::NoGradGuard no_grad;
    for (auto& b : buckets_) {
      if (options_.compression != GradCompression::kNone) b.flat.copy_(b.wire);
      for (size_t q : b.params) {
        Param& p = params_[q];
        auto slot = b.flat.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.sizes());
        if (!p.tensor.grad().defined()) {
          p.tensor.mutable_grad() = slot.clone();
        } else {
          p.tensor.mutable_grad().copy_(slot);
        }
      }
    }
  }
  Status error = step_error_;
  ResetStep();
  if (!error.ok()) return error;
  if (!unused.empty()) {
    std::string names = fmt::format("{}", fmt::join(unused, ", "));
    if (!options_.find_unused_parameters) {
      return FailedPrecondition(
          "{} parameter(s) got no gradient in backward: {}; set find_unused_parameters if "
          "this is expected", unused.size(), names);
    }
    if (!unused_reported_) {
      unused_reported_ = true;
      COHORT_LOG_INFO("train", "ddp: {} parameter(s) unused in backward (zero gradient): {}",
                      unused.size(), names);
    }
  }
  return Status::Ok();
}

std::vector<std::vector<std::string>> DistributedDataParallel::BucketLayout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : buckets_) {
    out.emplace_back();
    for (size_t q : b.params) out.back().push_back(params_[q].name);
  }
  return out;
}

}  // namespace cohort::train
