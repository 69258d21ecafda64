// Implements CohortProcessGroup (see process_group.h) and the adapter through which
// libcohort's setup reads and writes torch's c10d::Store.
#include "cohort/torch/process_group.h"

#include <Python.h>  // first, as Python asks
#include <ATen/ATen.h>
#include <pthread.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "cohort/base/strings.h"
#include "cohort/metrics/exporter.h"
#include "cohort/metrics/registry.h"
#include "cohort/torch/exit_gate.h"

namespace cohort::torch_backend {

using comm::DataType;
using comm::ReduceOp;
using c10d::OpType;

namespace {

// cohort::store::Store over torch's c10d::Store. libcohort uses its store only while a
// communicator is set up (host ids, shared-memory names, TCP addresses); calls are
// serialized because torch's TCPStore client is not safe to share between threads.
class TorchStore final : public store::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  Status Set(std::string_view key, std::string_view value, Deadline) override {
    return Call([&] { store_->set(std::string(key), Bytes(value)); });
  }
  Result<std::string> Get(std::string_view key, Deadline deadline) override {
    std::string out;
    COHORT_RETURN_IF_ERROR(Call([&] {
      store_->wait({std::string(key)}, Remaining(deadline));
      out = Text(store_->get(std::string(key)));
    }));
    return out;
  }
  Result<int64_t> Add(std::string_view key, int64_t delta, Deadline) override {
    int64_t out = 0;
    COHORT_RETURN_IF_ERROR(Call([&] { out = store_->add(std::string(key), delta); }));
    return out;
  }
  Result<std::string> CompareSet(std::string_view key, std::string_view expected,
                                 std::string_view desired, Deadline) override {
    std::string out;
    COHORT_RETURN_IF_ERROR(Call([&] {
      out = Text(store_->compareSet(std::string(key), Bytes(expected), Bytes(desired)));
    }));
    return out;
  }
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override {
    return Call([&] { store_->wait(keys, Remaining(deadline)); });
  }
  Result<bool> Check(const std::vector<std::string>& keys, Deadline) override {
    bool out = false;
    COHORT_RETURN_IF_ERROR(Call([&] { out = store_->check(keys); }));
    return out;
  }
  Result<std::vector<std::optional<std::string>>> Peek(const std::vector<std::string>& keys,
                                                       Deadline) override {
    std::vector<std::optional<std::string>> out;
    COHORT_RETURN_IF_ERROR(Call([&] {
      for (const auto& k : keys) {
        if (store_->check({k})) {
          out.emplace_back(Text(store_->get(k)));
        } else {
          out.emplace_back(std::nullopt);
        }
      }
    }));
    return out;
  }
  Result<bool> Delete(std::string_view key, Deadline) override {
    bool out = false;
    COHORT_RETURN_IF_ERROR(Call([&] { out = store_->deleteKey(std::string(key)); }));
    return out;
  }
  Result<int64_t> NumKeys(Deadline) override {
    int64_t out = 0;
    COHORT_RETURN_IF_ERROR(Call([&] { out = store_->getNumKeys(); }));
    return out;
  }
  Result<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                            Deadline deadline) override {
    std::vector<std::string> out;
    COHORT_RETURN_IF_ERROR(Call([&] {
      store_->wait(keys, Remaining(deadline));
      for (const auto& k : keys) out.push_back(Text(store_->get(k)));
    }));
    return out;
  }
  Status MultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values,
                  Deadline) override {
    return Call([&] {
      for (size_t i = 0; i < keys.size(); ++i) store_->set(keys[i], Bytes(values[i]));
    });
  }
  void Abort() override {}

 private:
  static std::vector<uint8_t> Bytes(std::string_view s) { return {s.begin(), s.end()}; }
  static std::string Text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
  static std::chrono::milliseconds Remaining(Deadline d) {
    if (d.infinite()) return std::chrono::hours(24 * 365);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining());
    return std::max(ms, std::chrono::milliseconds(1));
  }
  template <typename F>
  Status Call(F&& f) {
    MutexLock lock(&mu_);
    try {
      f();
      return Status::Ok();
    } catch (const std::exception& e) {
      std::string what = e.what();
      // torch reports a wait that ran out of time as a socket or wait timeout.
      if (what.find("imeout") != std::string::npos) {
        return DeadlineExceeded("torch store: {}", FirstLine(what));
      }
      return Unavailable("torch store: {}", FirstLine(what));
    }
  }
  static std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

  // One call at a time on torch's store client: every use of store_ is a lambda that Call
  // runs under mu_ (not annotated: the analysis does not follow a lambda into Call).
  Mutex mu_;
  c10::intrusive_ptr<c10d::Store> store_;
};

DataType ToDataType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DataType::kF32;
    case at::kDouble: return DataType::kF64;
    case at::kHalf: return DataType::kF16;
    case at::kBFloat16: return DataType::kBF16;
    case at::kChar: return DataType::kI8;
    case at::kByte: return DataType::kU8;
    case at::kInt: return DataType::kI32;
    case at::kLong: return DataType::kI64;
    default:
      TORCH_CHECK(false, "cohort backend: tensors of type ", t.scalar_type(),
                  " are not supported (float32/64, float16, bfloat16, int8/32/64, uint8)");
  }
}

ReduceOp ToReduceOp(const c10d::ReduceOp& op) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    default:
      TORCH_CHECK(false, "cohort backend: this reduce op is not supported "
                         "(SUM, PRODUCT, MIN, MAX, AVG are)");
  }
}

// A tensor libcohort can use: on the CPU, of a supported type. Checked when the operation is
// issued, so that a wrong argument raises in the caller, not later in wait().
void CheckTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "cohort backend: ", what, " is an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "cohort backend: ", what, " is on ", t.device(),
              "; the cohort backend runs on CPU tensors (use the nccl backend for CUDA)");
  TORCH_CHECK(!t.is_sparse(), "cohort backend: ", what, " is sparse; only dense tensors work");
  (void)ToDataType(t);
}

void CheckSingle(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "cohort backend: ", op,
              " takes exactly one tensor per process, got ", tensors.size());
  CheckTensor(tensors[0], op);
}

void CheckRoot(int64_t root, int size) {
  TORCH_CHECK(root >= 0 && root < size, "cohort backend: root rank ", root,
              " is outside the group of ", size);
}

void CheckSameType(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "cohort backend: ", op, ": tensors of ",
              a.scalar_type(), " and ", b.scalar_type(), " cannot be mixed");
}

// A list of one tensor per rank (all-gather outputs, gather outputs, scatter and
// reduce-scatter inputs), each like `like`.
void CheckPerRankList(const std::vector<std::vector<at::Tensor>>& lists, int size,
                      const at::Tensor& like, const char* op, const char* role) {
  TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size,
              "cohort backend: ", op, " needs one ", role, " list of ", size, " tensors");
  for (const auto& t : lists[0]) {
    CheckTensor(t, op);
    CheckSameType(t, like, op);
    TORCH_CHECK(t.numel() == like.numel(), "cohort backend: ", op, ": every ", role,
                " tensor must have ", like.numel(), " elements, not ", t.numel());
  }
}

// The reduction `op` asks for, refused now when it does not apply to the tensor's type.
ReduceOp CheckedReduceOp(const c10d::ReduceOp& op, const at::Tensor& t, const char* name) {
  const ReduceOp r = ToReduceOp(op);
  Status ok = comm::CheckOp(ToDataType(t), r);
  TORCH_CHECK(ok.ok(), "cohort backend: ", name, ": ", ok.message());
  return r;
}

void CheckPeer(int peer, int rank, int size, const char* what) {
  TORCH_CHECK(peer >= 0 && peer < size && peer != rank, "cohort backend: ", what, " rank ",
              peer, " (the group has ", size, " ranks; this is rank ", rank, ")");
}

// Offsets of blocks of `counts` elements laid end to end.
std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t j = 1; j < counts.size(); ++j) offsets[j] = offsets[j - 1] + counts[j - 1];
  return offsets;
}

// The contiguous tensor an operation reads or writes: `t` itself when it is contiguous,
// else a contiguous copy (written back by WriteBack).
at::Tensor Dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
void WriteBack(const at::Tensor& dense, at::Tensor& original) {
  if (!dense.is_same(original)) original.copy_(dense);
}

// A contiguous buffer holding `tensors` one after the other, and the way back.
at::Tensor Flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}
void Unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

[[noreturn]] void Fail(int rank, std::string_view op, const Status& st) {
  throw std::runtime_error(fmt::format("cohort backend, rank {}: {} failed: {}", rank, op,
                                       st.message()));
}

}  // namespace

namespace {
const c10::TypePtr& TensorListType() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return type;
}
}  // namespace

CohortWork::CohortWork(int rank, OpType type, std::vector<at::Tensor> outputs,
                       std::weak_ptr<Executor> executor)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(TensorListType())),
      executor_(std::move(executor)) {}

void CohortWork::Complete(std::exception_ptr error) {
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

bool CohortWork::wait(std::chrono::milliseconds timeout) {
  if (auto executor = executor_.lock()) executor->RunIfNext(this);
  return c10d::Work::wait(timeout);
}

Executor::Executor() {
  worker_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "pg-worker");
    Loop();
  });
}

Executor::~Executor() { Stop(); }

void Executor::Push(c10::intrusive_ptr<CohortWork> work, Task task) {
  {
    MutexLock lock(&mu_);
    TORCH_CHECK(!stopping_, "cohort backend: the process group is being destroyed");
    ++issued_;
    last_push_ = SteadyClock::now();
    queue_.emplace_back(std::move(work), std::move(task));
  }
  cv_.SignalAll();
}

bool Executor::RunIfNext(const CohortWork* work) {
  Item item;
  {
    MutexLock lock(&mu_);
    if (stopping_ || running_ || queue_.empty() || queue_.front().first.get() != work) {
      return false;
    }
    item = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
  }
  RunTaken(item);  // then the worker takes what was issued behind it
  return true;
}

namespace {

// The process's communication wait over every group: a counter, and the share of wall time
// per window of 2 s or more. Thread-safety: mu guards the window.
class WaitMeter {
 public:
  static WaitMeter& Get() {
    static WaitMeter* meter = new WaitMeter();  // never destroyed: used until exit
    return *meter;
  }
  void Add(double wait) COHORT_EXCLUDES(mu_) {
    total_.Add(wait);
    MutexLock lock(&mu_);
    window_wait_s_ += wait;
    const auto now = SteadyClock::now();
    const double window = std::chrono::duration<double>(now - window_start_).count();
    if (window >= 2.0) {
      fraction_.Set(std::min(1.0, window_wait_s_ / window));
      window_start_ = now;
      window_wait_s_ = 0;
    }
  }

 private:
  metrics::Counter& total_ = metrics::DefaultRegistry().GetCounter(
      "cohort_comm_wait_seconds_total",
      "Time from the last collective issued until the backend had finished them all");
  metrics::Gauge& fraction_ = metrics::DefaultRegistry().GetGauge(
      "cohort_comm_wait_fraction",
      "Share of wall time spent waiting for issued collectives to finish (last 2 s or more)");
  Mutex mu_;
  SteadyClock::time_point window_start_ COHORT_GUARDED_BY(mu_) = SteadyClock::now();
  double window_wait_s_ COHORT_GUARDED_BY(mu_) = 0;
};

}  // namespace

void Executor::RunTaken(Item& item) {
  const std::exception_ptr error = Run(item);
  double drained = -1;  // the wait ended by this item, when it emptied the queue
  {
    // Not running any more before the caller can see the result: a group the caller
    // destroys right after must not count this finished operation as pending (and abort,
    // dumping the flight recorder as if it had failed).
    MutexLock lock(&mu_);
    running_ = false;
    if (queue_.empty()) drained = std::chrono::duration<double>(SteadyClock::now() - last_push_).count();
  }
  item.first->Complete(error);
  ReleaseThroughGate(item.first);  // may be the last reference, the caller gone
  cv_.SignalAll();
  if (drained >= 0) WaitMeter::Get().Add(drained);
}

void Executor::Loop() {
  for (;;) {
    Item item;
    {
      MutexLock lock(&mu_);
      while (running_ || (!stopping_ && queue_.empty())) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    RunTaken(item);
  }
}

std::exception_ptr Executor::Run(Item& item) {
  // Collectives write into tensors that may require grad (parameters, buckets); like
  // torch's own backends they do so outside autograd.
  at::NoGradGuard no_grad;
  std::exception_ptr error;
  try {
    item.second();
  } catch (...) {
    error = std::current_exception();
  }
  ReleaseThroughGate(item.second);  // the captured tensors, before waking the caller
  return error;
}

void Executor::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (!worker_.joinable()) return;
  // Python drops the last reference to a group (e.g. DDP's reducer, collected with the GIL
  // held) while the worker may be releasing tensors whose Python objects need the GIL:
  // let go of it while waiting for the worker.
  if (Py_IsInitialized() && PyGILState_Check()) {
    Py_BEGIN_ALLOW_THREADS
    worker_.join();
    Py_END_ALLOW_THREADS
  } else {
    worker_.join();
  }
}

bool Executor::idle() {
  MutexLock lock(&mu_);
  return queue_.empty() && !running_;
}

uint64_t Executor::issued() {
  MutexLock lock(&mu_);
  return issued_;
}

CohortProcessGroup::CohortProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), store_(std::make_shared<TorchStore>(store)) {
  comm::CommOptions options;
  options.name = "torch";
  options.timeout = std::chrono::duration_cast<Duration>(timeout);
  // Under `cohort run`: the address peers on other hosts reach this rank at (--local-addr)
  // and where the flight record goes. Under another launcher the defaults apply.
  const Result<WorkerEnv> env = ReadWorkerEnv();
  if (env.ok()) comm::ApplyWorkerEnv(*env, options);
  auto comm = comm::Communicator::Create(store_, rank, size, options);
  if (!comm.ok()) {
    throw std::runtime_error(fmt::format(
        "cohort backend, rank {} of {}: cannot join the group: {}", rank, size,
        comm.status().message()));
  }
  comm_ = std::move(*comm);
  executor_ = std::make_shared<Executor>();
  // Under `cohort run --metrics-port`: the collectives' counts, bytes, time and wait go to
  // the agent's /metrics and dashboard like cohort-train's (no-op without a metrics dir).
  metrics::StartWorkerExporter();
  // cohort_torch.live re-forms the default group at the rank the agent announced (and sets
  // RANK to it first): the snapshots follow.
  if (env.ok()) metrics::SetExportedRank(env->rank);
  init();
}

CohortProcessGroup::~CohortProcessGroup() {
  // Work still queued when the group goes away fails rather than waiting for peers that
  // may never come.
  if (!executor_->idle()) comm_->Abort();
  executor_->Stop();
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::Enqueue(OpType type,
                                                           std::vector<at::Tensor> outputs,
                                                           Executor::Task task) {
  auto work = c10::make_intrusive<CohortWork>(rank_, type, std::move(outputs), executor_);
  executor_->Push(work, std::move(task));
  return work;
}

// Runs a libcohort operation to completion on this thread; a failure throws, naming it.
#define COHORT_WAIT(op_name, expr)                               \
  do {                                                           \
    Status st_ = (expr)->Wait();                                 \
    if (!st_.ok()) Fail(rank_, op_name, st_);                    \
  } while (0)

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  CheckSingle(tensors, "broadcast");
  CheckRoot(opts.rootRank, size_);
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return Enqueue(OpType::BROADCAST, tensors, [this, t, root]() mutable {
    at::Tensor d = Dense(t);
    COHORT_WAIT("broadcast", comm_->Broadcast(d.data_ptr(), d.numel(), ToDataType(d), root));
    WriteBack(d, t);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  CheckSingle(tensors, "allreduce");
  const ReduceOp op = CheckedReduceOp(opts.reduceOp, tensors[0], "allreduce");
  at::Tensor t = tensors[0];
  return Enqueue(OpType::ALLREDUCE, tensors, [this, t, op]() mutable {
    at::Tensor d = Dense(t);
    COHORT_WAIT("allreduce", comm_->AllReduce(d.data_ptr(), d.data_ptr(), d.numel(),
                                              ToDataType(d), op));
    WriteBack(d, t);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "cohort backend: allreduce_coalesced needs tensors");
  for (const auto& t : tensors) {
    CheckTensor(t, "allreduce_coalesced");
    CheckSameType(t, tensors[0], "allreduce_coalesced");
  }
  const ReduceOp op = CheckedReduceOp(opts.reduceOp, tensors[0], "allreduce_coalesced");
  return Enqueue(OpType::ALLREDUCE_COALESCED, tensors, [this, tensors, op]() mutable {
    at::Tensor flat = Flatten(tensors);
    COHORT_WAIT("allreduce_coalesced",
                comm_->AllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(),
                                 ToDataType(flat), op));
    Unflatten(flat, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  CheckSingle(tensors, "reduce");
  CheckRoot(opts.rootRank, size_);
  const ReduceOp op = CheckedReduceOp(opts.reduceOp, tensors[0], "reduce");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return Enqueue(OpType::REDUCE, tensors, [this, t, op, root]() mutable {
    at::Tensor d = Dense(t);
    COHORT_WAIT("reduce", comm_->Reduce(d.data_ptr(), d.data_ptr(), d.numel(), ToDataType(d),
                                        op, root));
    if (rank_ == root) WriteBack(d, t);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  CheckSingle(inputs, "allgather");
  CheckPerRankList(outputs, size_, inputs[0], "allgather", "output");
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs = outputs[0];
  return Enqueue(OpType::ALLGATHER, outs, [this, in, outs]() mutable {
    at::Tensor d = Dense(in);
    at::Tensor flat = at::empty({size_ * d.numel()}, d.options());
    COHORT_WAIT("allgather", comm_->AllGather(d.data_ptr(), flat.data_ptr(), d.numel(),
                                              ToDataType(d)));
    Unflatten(flat, outs);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  CheckTensor(input, "_allgather_base input");
  CheckTensor(output, "_allgather_base output");
  CheckSameType(input, output, "_allgather_base");
  TORCH_CHECK(output.numel() == size_ * input.numel(), "cohort backend: _allgather_base: the "
              "output must have ", size_, " x ", input.numel(), " elements, not ", output.numel());
  at::Tensor in = input, out = output;
  return Enqueue(OpType::_ALLGATHER_BASE, {output}, [this, in, out]() mutable {
    at::Tensor d = Dense(in), o = Dense(out);
    COHORT_WAIT("_allgather_base",
                comm_->AllGather(d.data_ptr(), o.data_ptr(), d.numel(), ToDataType(d)));
    WriteBack(o, out);
  });
}

std::vector<at::Tensor> CohortProcessGroup::RootList(
    const std::vector<std::vector<at::Tensor>>& lists, int64_t root, const at::Tensor& like,
    const char* op, const char* which) const {
  CheckRoot(root, size_);
  if (rank_ != root) {
    TORCH_CHECK(lists.empty() || lists[0].empty(), "cohort backend: ", op, " takes ", which,
                " tensors on the root only");
    return {};
  }
  CheckPerRankList(lists, size_, like, op, which);
  return lists[0];
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  CheckSingle(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs = RootList(outputs, root, inputs[0], "gather", "output");
  at::Tensor in = inputs[0];
  return Enqueue(OpType::GATHER, outs, [this, in, outs, root]() mutable {
    at::Tensor d = Dense(in);
    at::Tensor flat;
    if (rank_ == root) flat = at::empty({size_ * d.numel()}, d.options());
    COHORT_WAIT("gather", comm_->Gather(d.data_ptr(), rank_ == root ? flat.data_ptr() : nullptr,
                                        d.numel(), ToDataType(d), root));
    if (rank_ == root) Unflatten(flat, outs);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  CheckSingle(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins = RootList(inputs, root, outputs[0], "scatter", "input");
  at::Tensor out = outputs[0];
  return Enqueue(OpType::SCATTER, outputs, [this, out, ins, root]() mutable {
    at::Tensor o = Dense(out);
    at::Tensor flat;
    if (rank_ == root) flat = Flatten(ins);
    COHORT_WAIT("scatter", comm_->Scatter(rank_ == root ? flat.data_ptr() : nullptr,
                                          o.data_ptr(), o.numel(), ToDataType(o), root));
    WriteBack(o, out);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  CheckSingle(outputs, "reduce_scatter");
  CheckPerRankList(inputs, size_, outputs[0], "reduce_scatter", "input");
  const ReduceOp op = CheckedReduceOp(opts.reduceOp, outputs[0], "reduce_scatter");
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = inputs[0];
  return Enqueue(OpType::REDUCE_SCATTER, outputs, [this, out, ins, op]() mutable {
    at::Tensor flat = Flatten(ins);
    at::Tensor o = Dense(out);
    COHORT_WAIT("reduce_scatter", comm_->ReduceScatter(flat.data_ptr(), o.data_ptr(), o.numel(),
                                                       ToDataType(o), op));
    WriteBack(o, out);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  CheckTensor(input, "_reduce_scatter_base input");
  CheckTensor(output, "_reduce_scatter_base output");
  CheckSameType(input, output, "_reduce_scatter_base");
  TORCH_CHECK(input.numel() == size_ * output.numel(), "cohort backend: _reduce_scatter_base: "
              "the input must have ", size_, " x ", output.numel(), " elements, not ",
              input.numel());
  const ReduceOp op = CheckedReduceOp(opts.reduceOp, output, "_reduce_scatter_base");
  at::Tensor in = input, out = output;
  return Enqueue(OpType::_REDUCE_SCATTER_BASE, {output}, [this, in, out, op]() mutable {
    at::Tensor d = Dense(in), o = Dense(out);
    COHORT_WAIT("_reduce_scatter_base", comm_->ReduceScatter(d.data_ptr(), o.data_ptr(),
                                                             o.numel(), ToDataType(o), op));
    WriteBack(o, out);
  });
}

void CohortProcessGroup::UnevenAllToAll(const at::Tensor& in,
                                        const std::vector<int64_t>& send_counts,
                                        at::Tensor& out,
                                        const std::vector<int64_t>& recv_counts) {
  // Every rank pads its blocks to the largest block of the whole exchange and runs one
  // equal all-to-all; the padding is cut away on receipt.
  int64_t block = 0;
  for (int64_t c : send_counts) block = std::max(block, c);
  for (int64_t c : recv_counts) block = std::max(block, c);
  COHORT_WAIT("all_to_all (block size)",
              comm_->AllReduce(&block, &block, 1, DataType::kI64, ReduceOp::kMax));
  at::Tensor sendbuf = at::zeros({size_ * block}, in.options());
  at::Tensor recvbuf = at::empty({size_ * block}, in.options());
  at::Tensor flat_in = in.reshape({-1});
  const std::vector<int64_t> send_offsets = Offsets(send_counts);
  const std::vector<int64_t> recv_offsets = Offsets(recv_counts);
  for (int j = 0; j < size_; ++j) {
    sendbuf.narrow(0, j * block, send_counts[j])
        .copy_(flat_in.narrow(0, send_offsets[j], send_counts[j]));
  }
  COHORT_WAIT("all_to_all", comm_->AllToAll(sendbuf.data_ptr(), recvbuf.data_ptr(), block,
                                            ToDataType(in)));
  at::Tensor flat_out = out.view({-1});
  for (int j = 0; j < size_; ++j) {
    flat_out.narrow(0, recv_offsets[j], recv_counts[j])
        .copy_(recvbuf.narrow(0, j * block, recv_counts[j]));
  }
}

namespace {
// Element counts of blocks of `splits` rows (equal blocks when `splits` is empty).
std::vector<int64_t> SplitsToCounts(const std::vector<int64_t>& splits, int64_t numel,
                                    int64_t rows, int size, const char* which) {
  const int64_t row = rows > 0 ? numel / rows : 0;
  std::vector<int64_t> counts(size, 0);
  if (splits.empty()) {
    TORCH_CHECK(numel % size == 0, "cohort backend: all_to_all_single: the ", which,
                " has ", numel, " elements, not a multiple of the group size ", size);
    for (int j = 0; j < size; ++j) counts[j] = numel / size;
  } else {
    TORCH_CHECK(static_cast<int>(splits.size()) == size, "cohort backend: all_to_all_single: ",
                which, " split sizes name ", splits.size(), " ranks, the group has ", size);
    int64_t total = 0;
    for (int j = 0; j < size; ++j) {
      TORCH_CHECK(splits[j] >= 0, "cohort backend: all_to_all_single: negative split size");
      counts[j] = splits[j] * row;
      total += splits[j];
    }
    TORCH_CHECK(total == rows, "cohort backend: all_to_all_single: ", which,
                " split sizes add up to ", total, " rows, the tensor has ", rows);
  }
  return counts;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions&) {
  CheckTensor(input, "all_to_all_single input");
  CheckTensor(output, "all_to_all_single output");
  CheckSameType(input, output, "all_to_all_single");
  const int64_t in_rows = input.dim() ? input.size(0) : 1;
  const int64_t out_rows = output.dim() ? output.size(0) : 1;
  const std::vector<int64_t> sc =
      SplitsToCounts(input_split_sizes, input.numel(), in_rows, size_, "input");
  const std::vector<int64_t> rc =
      SplitsToCounts(output_split_sizes, output.numel(), out_rows, size_, "output");
  const bool equal = input_split_sizes.empty() && output_split_sizes.empty();
  at::Tensor in = input, out = output;
  return Enqueue(OpType::ALLTOALL_BASE, {output}, [=, this]() mutable {
    at::Tensor d = Dense(in), o = Dense(out);
    if (equal) {
      COHORT_WAIT("all_to_all_single", comm_->AllToAll(d.data_ptr(), o.data_ptr(),
                                                       d.numel() / size_, ToDataType(d)));
    } else {
      UnevenAllToAll(d, sc, o, rc);
    }
    WriteBack(o, out);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == size_ &&
                  static_cast<int>(outputs.size()) == size_,
              "cohort backend: all_to_all needs ", size_, " input and ", size_,
              " output tensors");
  std::vector<int64_t> sc(size_), rc(size_);
  for (int j = 0; j < size_; ++j) {
    CheckTensor(inputs[j], "all_to_all input");
    CheckTensor(outputs[j], "all_to_all output");
    CheckSameType(inputs[j], inputs[0], "all_to_all");
    CheckSameType(outputs[j], inputs[0], "all_to_all");
    sc[j] = inputs[j].numel();
    rc[j] = outputs[j].numel();
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return Enqueue(OpType::ALLTOALL, outputs, [=, this]() mutable {
    at::Tensor flat_in = Flatten(ins);
    at::Tensor flat_out =
        at::empty({std::accumulate(rc.begin(), rc.end(), int64_t{0})}, flat_in.options());
    UnevenAllToAll(flat_in, sc, flat_out, rc);
    Unflatten(flat_out, outs);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::send(std::vector<at::Tensor>& tensors,
                                                        int dst, int tag) {
  CheckSingle(tensors, "send");
  CheckPeer(dst, rank_, size_, "send to");
  at::Tensor t = tensors[0];
  return Enqueue(OpType::SEND, tensors, [this, t, dst, tag]() mutable {
    at::Tensor d = Dense(t);
    COHORT_WAIT("send", comm_->Send(d.data_ptr(), d.numel(), ToDataType(d), dst, tag));
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::recv(std::vector<at::Tensor>& tensors,
                                                        int src, int tag) {
  CheckSingle(tensors, "recv");
  CheckPeer(src, rank_, size_, "recv from");
  at::Tensor t = tensors[0];
  return Enqueue(OpType::RECV, tensors, [this, t, src, tag]() mutable {
    at::Tensor d = Dense(t);
    COHORT_WAIT("recv", comm_->Recv(d.data_ptr(), d.numel(), ToDataType(d), src, tag));
    WriteBack(d, t);
  });
}

c10::intrusive_ptr<c10d::Work> CohortProcessGroup::barrier(const c10d::BarrierOptions&) {
  return Enqueue(OpType::BARRIER, {}, [this] { COHORT_WAIT("barrier", comm_->Barrier()); });
}

#undef COHORT_WAIT

c10::intrusive_ptr<c10d::ProcessGroup> CreateProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<double> timeout) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  if (ms.count() <= 0) ms = std::chrono::minutes(30);
  return c10::make_intrusive<CohortProcessGroup>(store, rank, size, ms);
}

}  // namespace cohort::torch_backend
