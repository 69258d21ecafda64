// Implements Communicator: setup, the ordered operation queue, algorithm selection.
// Thread-safety: mu_ guards the queue, sequence counters and worker state; runner_mu_ is
// held by whichever thread executes operations and so owns the transports and scratch_;
// status_mu_ guards broken_.
#include "cohort/comm/communicator.h"

#include <array>
#include <cstring>
#include <fstream>

#include "cohort/base/log.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/comm/algorithms.h"
#include "cohort/comm/flight_recorder.h"
#include "cohort/comm/reduce.h"
#include "cohort/metrics/registry.h"
#include "cohort/net/socket.h"
#include "cohort/store/memory_store.h"

namespace cohort::comm {
namespace {

constexpr const char* kLog = "comm";
constexpr size_t kDefaultSlotBytes = 256u << 10;  // L2-sized chunks: see docs/collectives.md
constexpr size_t kShmDirectMaxBytes = 256u << 10;
constexpr size_t kTcpRecursiveDoublingMaxBytes = 64u << 10;
constexpr size_t kTcpHalvingDoublingMaxBytes = 1u << 20;  // see docs/collectives.md

std::string DefaultHostId() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return net::HostName() + ":" + boot;
}

enum class Algo {
  kShmDirect,
  kShmReduceScatter,
  kRing,
  kRecursiveDoubling,
  kHalvingDoubling,
  kHierarchical
};

}  // namespace

void Work::Finish(Status s) {
  {
    MutexLock lock(&mu_);
    done_ = true;
    status_ = std::move(s);
  }
  cv_.SignalAll();
}

Status Work::Wait(Deadline deadline) {
  MutexLock lock(&mu_);
  while (!done_) {
    if (!cv_.WaitUntil(&mu_, deadline) && !done_) {
      return DeadlineExceeded("operation still running at the wait deadline");
    }
  }
  return status_;
}

bool Work::IsCompleted() const {
  MutexLock lock(&mu_);
  return done_;
}

class Communicator::Impl {
 public:
  Impl(int rank, int size, CommOptions options)
      : rank_(rank), size_(size), o_(std::move(options)), recorder_(rank, o_.flight_recorder, o_.flight_recorder_dir),
        send_seq_(size, 0), recv_seq_(size, 0) {}
  ~Impl() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    queue_cv_.SignalAll();
    if (worker_.joinable()) worker_.join();
  }

  // Forms the group through `store` by `form_by` (default: the operation timeout).
  Status Setup(store::Store& store, Deadline form_by = Deadline::Infinite());
  // Queues an operation; `p2p_send`/`peer` pick the per-pair sequence of a send or recv.
  WorkPtr Issue(OpDesc desc, std::function<Status(Call&)> body, Exec exec,
                bool p2p_send = false, int peer = 0);
  WorkPtr Failed(Status s) {
    auto w = std::make_shared<Work>();
    w->Finish(std::move(s));
    return w;
  }
  void Abort();
  // Fails what is pending with `why` (kAborted) and closes the transports; for Reform.
  void Interrupt(Status why);
  // After Setup failed: every operation fails with `why`.
  void MarkBroken(Status why) {
    MutexLock lock(&status_mu_);
    if (broken_.ok()) broken_ = std::move(why);
  }
  const CommOptions& options() const { return o_; }
  std::string topology() const {
    if (size_ == 1) return "self";
    if (UseShm()) return "shm";
    if (shm_) return "shm+tcp";
    return "tcp";
  }
  std::string Dump() const { return recorder_.Dump(); }

  // Collective bodies (run by the runner).
  Status AllReduce(const void* in, void* out, size_t count, DataType t, ReduceOp op, Call& c);
  bool UseShm() const { return shm_ && single_host_ && !tcp_only_; }
  ShmGroup& shm() { return *shm_; }
  TcpGroup& all() { return all_; }
  int size() const { return size_; }
  TcpMesh& mesh() { return *mesh_; }
  // Point-to-point through shared memory when the peer shares this host, else TCP.
  Status SendTo(int peer, const void* buf, size_t bytes, Call& c) {
    int member = LocalMember(peer);
    if (member >= 0) return shm_->Send(member, buf, bytes, c.desc, c.deadline);
    return mesh_->Send(peer, buf, bytes, c.desc, c.deadline);
  }
  Status RecvFrom(int peer, void* buf, size_t bytes, Call& c) {
    int member = LocalMember(peer);
    if (member >= 0) return shm_->Recv(member, buf, bytes, c.desc, c.deadline);
    return mesh_->Recv(peer, buf, bytes, c.desc, c.deadline);
  }
  int LocalMember(int rank) const {
    if (!shm_) return -1;
    for (int m = 0; m < shm_->size(); ++m) {
      if (shm_->global_rank(m) == rank) return m;
    }
    return -1;
  }

 private:
  struct Pending {
    OpDesc desc;
    std::function<Status(Call&)> body;
    WorkPtr work;
    size_t recorder_id;
  };
  void RecordMetrics(const OpDesc& desc, double seconds) COHORT_REQUIRES(runner_mu_);
  // Metrics per OpKind, resolved on first use (Execute runs under runner_mu_).
  struct OpCounters {
    metrics::Counter* operations = nullptr;
    metrics::Counter* bytes = nullptr;
    metrics::Counter* seconds = nullptr;
  };
  std::array<OpCounters, static_cast<size_t>(OpKind::kSend) + 1> op_counters_
      COHORT_GUARDED_BY(runner_mu_){};
  Algo ChooseAllReduce(size_t bytes) const;
  Algo ChooseTcp(size_t bytes, int members) const;
  Status TcpAllReduce(TcpGroup& g, const void* in, void* out, size_t count, DataType t,
                      ReduceOp op, Call& c);
  void Execute(Pending& p) COHORT_REQUIRES(runner_mu_);
  // Takes the oldest queued operation and executes it; false when none is queued.
  bool RunNext() COHORT_REQUIRES(runner_mu_) COHORT_EXCLUDES(mu_);
  void WorkerLoop();
  Status Broken() {
    MutexLock lock(&status_mu_);
    return broken_;
  }

  const int rank_, size_;
  const CommOptions o_;
  FlightRecorder recorder_;
  // Topology, fixed after Setup.
  bool single_host_ = true;
  bool tcp_only_ = false;
  std::unique_ptr<ShmGroup> shm_;
  std::unique_ptr<TcpMesh> mesh_;
  TcpGroup all_, leaders_;
  bool leader_ = true;
  std::string forced_algo_;
  Duration timeout_;
  // The queue. Lock order: runner_mu_ before mu_ (RunNext takes mu_ under runner_mu_).
  Mutex mu_;
  CondVar queue_cv_;  // an async operation was queued, or the communicator stops
  std::deque<Pending> queue_ COHORT_GUARDED_BY(mu_);
  uint32_t next_seq_ COHORT_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> send_seq_ COHORT_GUARDED_BY(mu_), recv_seq_ COHORT_GUARDED_BY(mu_);
  bool stopping_ COHORT_GUARDED_BY(mu_) = false;
  std::thread worker_ COHORT_GUARDED_BY(mu_);  // started by the first async Issue
  // The runner: one thread at a time runs operations.
  Mutex runner_mu_;
  std::vector<char> scratch_ COHORT_GUARDED_BY(runner_mu_);
  // The failure state.
  Mutex status_mu_;
  Status broken_ COHORT_GUARDED_BY(status_mu_);
};

Status Communicator::Impl::Setup(store::Store& store, Deadline form_by) {
  timeout_ = o_.timeout;
  if (timeout_ <= Duration::zero()) {
    const double t = settings::kCommTimeout.Get();
    timeout_ = t > 0 ? std::chrono::duration_cast<Duration>(std::chrono::duration<double>(t))
                     : std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
                           settings::kCommTimeout.default_value()));
  }
  std::string transport = !o_.transport.empty() ? o_.transport : settings::kTransport.Get();
  tcp_only_ = transport == "tcp";
  if (!transport.empty() && transport != "tcp" && transport != "shm" && transport != "auto") {
    return InvalidArgument("unknown transport '{}' (auto, shm, tcp)", transport);
  }
  forced_algo_ = !o_.algo.empty() ? o_.algo : settings::kAlgo.Get();
  if (!forced_algo_.empty() && forced_algo_ != "ring" && forced_algo_ != "rd" &&
      forced_algo_ != "rabenseifner" && forced_algo_ != "shm_direct" &&
      forced_algo_ != "shm_rs" && forced_algo_ != "hier") {
    return InvalidArgument(
        "COHORT_ALGO '{}' is not one of ring, rd, rabenseifner, shm_direct, shm_rs, hier",
        forced_algo_);
  }
  size_t slot = o_.shm_slot_bytes;
  if (slot == 0) slot = static_cast<size_t>(std::max<int64_t>(settings::kShmSlotBytes.Get(), 0));
  if (slot == 0) slot = kDefaultSlotBytes;
  const Deadline deadline = form_by.infinite() ? Deadline::After(timeout_) : form_by;
  const std::string prefix = "comm/" + o_.name;

  // Topology: who shares a host with whom.
  std::string host = !o_.host_id.empty() ? o_.host_id : settings::kHostId.Get();
  if (host.empty()) host = DefaultHostId();
  COHORT_RETURN_IF_ERROR(store.Set(fmt::format("{}/host/{}", prefix, rank_), host, deadline));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(fmt::format("{}/host/{}", prefix, r));
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> hosts, store.MultiGet(keys, deadline));
  std::vector<int> local, leaders;
  std::vector<std::string> seen;
  for (int r = 0; r < size_; ++r) {
    if (hosts[r] == host) local.push_back(r);
    if (std::find(seen.begin(), seen.end(), hosts[r]) == seen.end()) {
      seen.push_back(hosts[r]);
      leaders.push_back(r);
    }
  }
  single_host_ = seen.size() == 1;
  const int local_index =
      static_cast<int>(std::find(local.begin(), local.end(), rank_) - local.begin());
  leader_ = local_index == 0;
  if (local.size() > 1 && !tcp_only_) {
    COHORT_ASSIGN_OR_RETURN(shm_, ShmGroup::Create(store, fmt::format("{}/shm{}", prefix, local[0]),
                                                   local, local_index, slot, deadline,
                                                   o_.job_cookie));
  }
  if (transport == "shm" && !single_host_) {
    return FailedPrecondition("transport 'shm' needs every rank on one host; ranks span {} hosts",
                              seen.size());
  }
  if (size_ > 1) {
    std::string addr = o_.listen_addr;
    if (addr.empty()) {
      addr = single_host_ ? "127.0.0.1" : net::ResolveIpv4(net::HostName()).value_or("127.0.0.1");
    }
    COHORT_ASSIGN_OR_RETURN(mesh_, TcpMesh::Create(store, prefix, rank_, size_, addr, deadline));
  }
  all_.mesh = mesh_.get();
  all_.index = rank_;
  for (int r = 0; r < size_; ++r) all_.members.push_back(r);
  leaders_.mesh = mesh_.get();
  leaders_.members = leaders;
  leaders_.index = leader_ ? static_cast<int>(std::find(leaders.begin(), leaders.end(), rank_) -
                                              leaders.begin())
                           : -1;
  COHORT_LOG_DEBUG(kLog, "rank {} of {}: {} host(s), {} local rank(s), transport {}", rank_,
                   size_, seen.size(), local.size(), topology());
  return Status::Ok();
}

Algo Communicator::Impl::ChooseAllReduce(size_t bytes) const {
  const std::string& f = forced_algo_;
  if (UseShm()) {
    if (f == "shm_direct") return Algo::kShmDirect;
    if (f == "shm_rs") return Algo::kShmReduceScatter;
    if (f.empty()) {
      // Two ranks too: above 256 KiB reducing half each and gathering the other half
      // beats both reducing everything (2 ranks, barrier before every call, median:
      // 1 MiB 12.2 vs 10.2 GB/s busbw, 16 MiB 6.9-8.4 vs 5.6-5.9, 64 MiB 7.3 vs 5.9).
      return bytes < kShmDirectMaxBytes ? Algo::kShmDirect : Algo::kShmReduceScatter;
    }
  }
  // Every rank must choose the same algorithm: decide from job-wide facts only.
  if (!single_host_ && !tcp_only_ && (f.empty() || f == "hier")) {
    return Algo::kHierarchical;
  }
  return ChooseTcp(bytes, size_);
}

// Flat TCP algorithm for `bytes` among `members` ranks (every member decides alike).
Algo Communicator::Impl::ChooseTcp(size_t bytes, int members) const {
  const std::string& f = forced_algo_;
  if (f == "ring") return Algo::kRing;
  if (f == "rd") return Algo::kRecursiveDoubling;
  if (f == "rabenseifner") return Algo::kHalvingDoubling;
  if (bytes <= kTcpRecursiveDoublingMaxBytes) return Algo::kRecursiveDoubling;
  // Halving-doubling takes log2(n) steps instead of 2(n-1), but the folded ranks of a
  // group that is not a power of two send the whole buffer once more.
  const bool power_of_two = (members & (members - 1)) == 0;
  if (members > 2 && power_of_two && bytes <= kTcpHalvingDoublingMaxBytes) {
    return Algo::kHalvingDoubling;
  }
  return Algo::kRing;
}

Status Communicator::Impl::TcpAllReduce(TcpGroup& g, const void* in, void* out, size_t count,
                                        DataType t, ReduceOp op, Call& c) {
  const size_t bytes = count * DataTypeSize(t);
  switch (ChooseTcp(bytes, g.size())) {
    case Algo::kRecursiveDoubling:
      if (in != out) std::memmove(out, in, bytes);
      return TcpAllReduceRecursiveDoubling(g, out, count, t, op, c);
    case Algo::kHalvingDoubling:
      return TcpAllReduceHalvingDoubling(g, in, out, count, t, op, c);
    default:
      return TcpAllReduceRing(g, in, out, count, t, op, c);
  }
}

Status Communicator::Impl::AllReduce(const void* in, void* out, size_t count, DataType t,
                                     ReduceOp op, Call& c) {
  const size_t bytes = count * DataTypeSize(t);
  if (size_ == 1) {
    if (in != out) std::memmove(out, in, bytes);
    if (op == ReduceOp::kAvg) FinishAvg(out, count, t, 1);
    return Status::Ok();
  }
  Algo algo = ChooseAllReduce(bytes);
  switch (algo) {
    case Algo::kShmDirect:
    case Algo::kShmReduceScatter:
      return ShmAllReduce(*shm_, in, out, count, t, op, algo == Algo::kShmDirect, c);
    case Algo::kRing:
    case Algo::kRecursiveDoubling:
    case Algo::kHalvingDoubling:
      return TcpAllReduce(all_, in, out, count, t, op, c);
    case Algo::kHierarchical: {
      // Sum inside the host to the local leader, across hosts among leaders, then
      // broadcast inside the host. kAvg divides once, at the leaders.
      const ReduceOp sub = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
      if (shm_) {
        COHORT_RETURN_IF_ERROR(ShmReduce(*shm_, in, out, count, t, sub, 0, c));
      } else if (in != out) {
        std::memmove(out, in, bytes);  // the only rank on its host
      }
      if (leader_) {
        COHORT_RETURN_IF_ERROR(TcpAllReduce(leaders_, out, out, count, t, sub, c));
        if (op == ReduceOp::kAvg) FinishAvg(out, count, t, size_);
      }
      return shm_ ? ShmBroadcast(*shm_, out, bytes, 0, c) : Status::Ok();
    }
  }
  return Internal("unreachable");
}

Communicator::WorkPtr Communicator::Impl::Issue(OpDesc desc, std::function<Status(Call&)> body,
                                                Exec exec, bool p2p_send, int peer) {
  auto work = std::make_shared<Work>();
  {
    MutexLock lock(&mu_);
    if (desc.kind == OpKind::kSend) {
      desc.seq = p2p_send ? send_seq_[peer]++ : recv_seq_[peer]++;
    } else {
      desc.seq = next_seq_++;
    }
    size_t id = recorder_.Record(desc);
    queue_.push_back(Pending{desc, std::move(body), work, id});
    if (exec == Exec::kAsync) {
      if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
      queue_cv_.Signal();
      return work;
    }
  }
  // Inline: run queued operations (ours is last) on this thread.
  MutexLock runner(&runner_mu_);
  while (!work->IsCompleted() && RunNext()) {
  }
  return work;
}

bool Communicator::Impl::RunNext() {
  Pending p;
  {
    MutexLock lock(&mu_);
    if (queue_.empty()) return false;
    p = std::move(queue_.front());
    queue_.pop_front();
  }
  Execute(p);
  return true;
}

void Communicator::Impl::WorkerLoop() {
  pthread_setname_np(pthread_self(), "comm-worker");
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) queue_cv_.Wait(&mu_);
      if (stopping_ && queue_.empty()) return;
    }
    MutexLock runner(&runner_mu_);
    while (RunNext()) {
    }
  }
}

void Communicator::Impl::Execute(Pending& p) {
  Status broken = Broken();
  if (!broken.ok()) {
    Status st(broken.code(), fmt::format("{} not run: the communicator failed earlier: {}",
                                         p.desc.ToString(), broken.message()));
    recorder_.Update(p.recorder_id, p.desc.seq, OpState::kFailed, "not run");
    p.work->Finish(st);
    return;
  }
  recorder_.Update(p.recorder_id, p.desc.seq, OpState::kStarted);
  Call call{p.desc, Deadline::After(timeout_), scratch_};
  const auto started = SteadyClock::now();
  Status st = p.body(call);
  if (st.ok()) {
    recorder_.Update(p.recorder_id, p.desc.seq, OpState::kCompleted);
    RecordMetrics(p.desc, SecondsSince(started));
  } else {
    recorder_.Update(p.recorder_id, p.desc.seq, OpState::kFailed, st.message());
    {
      MutexLock lock(&status_mu_);
      if (broken_.ok()) {
        broken_ = st;
      } else if (broken_.code() == StatusCode::kAborted) {
        // Cut short by a reconfiguration (Interrupt): say so, not how the transport broke.
        st = Status(StatusCode::kAborted,
                    fmt::format("{} interrupted: {}", p.desc.ToString(), broken_.message()));
      }
    }
    COHORT_LOG_ERROR(kLog, "rank {}: {}", rank_, st.ToString());
    if (st.code() == StatusCode::kDeadlineExceeded) recorder_.DumpNow("timeout");
  }
  p.work->Finish(std::move(st));
}

// Per kind of operation: count, bytes (count x element size: the buffer each rank hands
// in) and time, for the agent's /metrics and the dashboard's bandwidth column. The counters
// are looked up once per kind (the registry lookup takes a mutex and builds labels): this
// runs after every collective.
void Communicator::Impl::RecordMetrics(const OpDesc& desc, double seconds) {
  OpCounters& c = op_counters_[static_cast<size_t>(desc.kind)];
  if (c.operations == nullptr) {
    auto& registry = metrics::DefaultRegistry();
    const metrics::Labels labels = {{"op", std::string(OpKindName(desc.kind))}};
    c.operations = &registry.GetCounter("cohort_comm_operations_total",
                                        "Collective operations completed", labels);
    c.bytes = &registry.GetCounter("cohort_comm_bytes_total",
                                   "Bytes handed to collectives by this rank", labels);
    c.seconds = &registry.GetCounter("cohort_comm_seconds_total",
                                     "Time spent running collectives", labels);
  }
  c.operations->Add();
  c.bytes->Add(static_cast<double>(desc.count * DataTypeSize(desc.dtype)));
  c.seconds->Add(seconds);
}

void Communicator::Impl::Interrupt(Status why) {
  MarkBroken(std::move(why));
  if (mesh_) mesh_->Abort();
  if (shm_) shm_->Abort();
}

void Communicator::Impl::Abort() {
  Interrupt(Cancelled("rank {} aborted the communicator", rank_));
  recorder_.DumpNow("abort");
}

// ---------------------------------------------------------------------------------------

Communicator::Communicator(std::unique_ptr<Impl> impl, int rank, int size)
    : impl_(std::move(impl)), rank_(rank), size_(size) {}
Communicator::~Communicator() = default;

namespace {
Status ValidMember(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("rank {} is not in a world of {} rank(s)", rank, size);
  }
  return Status::Ok();
}
}  // namespace

Result<std::unique_ptr<Communicator>> Communicator::Create(std::shared_ptr<store::Store> store,
                                                           int rank, int size,
                                                           CommOptions options) {
  COHORT_RETURN_IF_ERROR(ValidMember(rank, size));
  auto impl = std::make_unique<Impl>(rank, size, std::move(options));
  COHORT_RETURN_IF_ERROR(impl->Setup(*store));
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl), rank, size));
}

void ApplyWorkerEnv(const WorkerEnv& env, CommOptions& options) {
  if (options.listen_addr.empty()) options.listen_addr = env.listen_addr;
  if (options.flight_recorder_dir.empty()) options.flight_recorder_dir = env.flight_recorder_dir;
  if (options.job_cookie.empty()) options.job_cookie = env.job_cookie;
}

Result<std::unique_ptr<Communicator>> Communicator::FromEnvironment(CommOptions options) {
  Result<WorkerEnv> launched = ReadWorkerEnv();
  if (!launched.ok() && launched.status().code() != StatusCode::kNotFound) {
    return FailedPrecondition("{}", launched.status().message());
  }
  // Not started by a launcher: a job of one rank, as WORLD_SIZE=1.
  const WorkerEnv env = launched.ok() ? *launched : WorkerEnv{};
  if (std::string missing = JobStoreMissing(env); !missing.empty()) {
    return FailedPrecondition("{}", missing);
  }
  ApplyWorkerEnv(env, options);
  if (env.world_size == 1) {
    return Create(std::make_shared<store::MemoryStore>(), 0, 1, std::move(options));
  }
  // Steps: connect to the job's store (60 s to reach it), narrow it to this round's keys,
  // then form the communicator of world_size ranks there (Create).
  COHORT_ASSIGN_OR_RETURN(std::shared_ptr<store::Store> store,
                          ConnectJobStore(env.store, Deadline::AfterMs(60000)));
  if (!env.store.round_prefix.empty()) {
    store = std::make_shared<store::PrefixStore>(env.store.round_prefix, store);
  }
  return Create(store, env.rank, env.world_size, std::move(options));
}

std::string Communicator::topology() const { return impl_->topology(); }
void Communicator::Abort() {
  MutexLock lock(&impl_mu_);
  if (forming_) {
    pending_interrupt_ = Cancelled("rank {} aborted the communicator", rank_);
    return;
  }
  impl_->Abort();
}
std::string Communicator::FlightRecorderDump() const { return impl_->Dump(); }

void Communicator::Interrupt(std::string_view why) {
  Status status(StatusCode::kAborted, fmt::format("membership changed: {}", why));
  MutexLock lock(&impl_mu_);
  if (forming_) {
    pending_interrupt_ = std::move(status);  // applied once the group formed (Reform)
    return;
  }
  impl_->Interrupt(std::move(status));
}

Status Communicator::Reform(std::shared_ptr<store::Store> store, int rank, int size,
                            Deadline deadline) {
  COHORT_RETURN_IF_ERROR(ValidMember(rank, size));
  std::unique_ptr<Impl> old;
  {
    // 1. The old group: what is pending fails with kAborted; its worker thread drains the
    // queue and exits, its connections and shared memory close (old's destructor).
    MutexLock lock(&impl_mu_);
    CommOptions options = impl_->options();
    impl_->Interrupt(Status(StatusCode::kAborted,
                            fmt::format("membership changed: rank {} of {} re-forms as rank {} "
                                        "of {}",
                                        rank_, size_, rank, size)));
    old = std::move(impl_);
    impl_ = std::make_unique<Impl>(rank, size, options);
    forming_ = true;
    pending_interrupt_.reset();
  }
  old.reset();
  rank_ = rank;
  size_ = size;
  // 2. The new group, formed as Create does, by `deadline`. Interrupt and Abort wait
  // (pending_interrupt_) until it stands: Setup is writing the transports they close.
  Status st = impl_->Setup(*store, deadline);
  if (!st.ok()) st = st.WithContext(fmt::format("re-forming as rank {} of {}", rank, size));
  MutexLock lock(&impl_mu_);
  forming_ = false;
  if (!st.ok()) {
    impl_->MarkBroken(st);
  } else if (pending_interrupt_) {
    impl_->Interrupt(*pending_interrupt_);
  }
  pending_interrupt_.reset();
  return st;
}

namespace {
Status ValidRoot(int root, int size, std::string_view what) {
  if (root < 0 || root >= size) {
    return InvalidArgument("{} rank {} is not in a world of {}", what, root, size);
  }
  return Status::Ok();
}
}  // namespace

Communicator::WorkPtr Communicator::AllReduce(const void* in, void* out, size_t count,
                                              DataType t, ReduceOp op, Exec exec) {
  if (Status s = CheckOp(t, op); !s.ok()) return impl_->Failed(s);
  OpDesc d{0, OpKind::kAllReduce, t, op, 0, -1, count};
  Impl* impl = impl_.get();
  return impl_->Issue(d, [=](Call& c) { return impl->AllReduce(in, out, count, t, op, c); },
                      exec);
}

Communicator::WorkPtr Communicator::ReduceScatter(const void* in, void* out, size_t count,
                                                  DataType t, ReduceOp op, Exec exec) {
  if (Status s = CheckOp(t, op); !s.ok()) return impl_->Failed(s);
  OpDesc d{0, OpKind::kReduceScatter, t, op, 0, -1, count};
  Impl* impl = impl_.get();
  return impl_->Issue(d, [=](Call& c) {
    if (impl->UseShm()) return ShmReduceScatter(impl->shm(), in, out, count, t, op, c);
    return TcpReduceScatterRing(impl->all(), in, out, count, t, op, c);
  }, exec);
}

Communicator::WorkPtr Communicator::Broadcast(void* buf, size_t count, DataType t, int root,
                                              Exec exec) {
  if (Status s = ValidRoot(root, size_, "broadcast root"); !s.ok()) return impl_->Failed(s);
  OpDesc d{0, OpKind::kBroadcast, t, ReduceOp::kSum, 0, root, count};
  Impl* impl = impl_.get();
  const size_t bytes = count * DataTypeSize(t);
  return impl_->Issue(d, [=](Call& c) {
    if (impl->size() == 1) return Status::Ok();
    if (impl->UseShm()) return ShmBroadcast(impl->shm(), buf, bytes, root, c);
    return TcpBroadcastTree(impl->all(), buf, bytes, root, c);
  }, exec);
}

Communicator::WorkPtr Communicator::Reduce(const void* in, void* out, size_t count, DataType t,
                                           ReduceOp op, int root, Exec exec) {
  if (Status s = CheckOp(t, op); !s.ok()) return impl_->Failed(s);
  if (Status s = ValidRoot(root, size_, "reduce root"); !s.ok()) return impl_->Failed(s);
  OpDesc d{0, OpKind::kReduce, t, op, 0, root, count};
  Impl* impl = impl_.get();
  return impl_->Issue(d, [=](Call& c) {
    if (impl->UseShm()) return ShmReduce(impl->shm(), in, out, count, t, op, root, c);
    if (impl->size() == 1) {
      if (in != out) std::memmove(out, in, count * DataTypeSize(t));
      if (op == ReduceOp::kAvg) FinishAvg(out, count, t, 1);
      return Status::Ok();
    }
    return TcpReduceTree(impl->all(), in, out, count, t, op, root, c);
  }, exec);
}

namespace {

// The data-movement collectives (all-gather, gather, scatter, all-to-all): the same shape on
// both transports, a byte count and, for the rooted ones, a root.
struct Movement {
  const char* root_name;  // for the error of a bad root; nullptr: the collective has none
  OpKind kind;
  Status (*shm)(ShmGroup&, const void* in, void* out, size_t bytes, int root, Call);
  Status (*tcp)(TcpGroup&, const void* in, void* out, size_t bytes, int root, Call);
};
constexpr Movement kAllGather{
    nullptr, OpKind::kAllGather,
    [](ShmGroup& g, const void* in, void* out, size_t bytes, int, Call c) {
      return ShmAllGather(g, in, out, bytes, c);
    },
    [](TcpGroup& g, const void* in, void* out, size_t bytes, int, Call c) {
      return TcpAllGatherRing(g, in, out, bytes, c);
    }};
constexpr Movement kGather{"gather root", OpKind::kGather, ShmGather, TcpGather};
constexpr Movement kScatter{"scatter root", OpKind::kScatter, ShmScatter, TcpScatter};
constexpr Movement kAllToAll{
    nullptr, OpKind::kAllToAll,
    [](ShmGroup& g, const void* in, void* out, size_t bytes, int, Call c) {
      return ShmAllToAll(g, in, out, bytes, c);
    },
    [](TcpGroup& g, const void* in, void* out, size_t bytes, int, Call c) {
      if (in != out) return TcpAllToAll(g, in, out, bytes, c);
      // The pairwise exchange reads blocks it already overwrote: work from a copy.
      std::vector<char> copy(static_cast<const char*>(in),
                             static_cast<const char*>(in) + bytes * g.size());
      return TcpAllToAll(g, copy.data(), out, bytes, c);
    }};

template <typename Impl>
Communicator::WorkPtr IssueMovement(Impl& impl, int size, const Movement& m, const void* in,
                                    void* out, size_t count, DataType t, int root, Exec exec) {
  if (m.root_name != nullptr) {
    if (Status s = ValidRoot(root, size, m.root_name); !s.ok()) return impl.Failed(s);
  }
  OpDesc d{0, m.kind, t, ReduceOp::kSum, 0, root, count};
  Impl* p = &impl;
  const size_t bytes = count * DataTypeSize(t);
  return impl.Issue(d, [=](Call& c) {
    if (p->UseShm()) return m.shm(p->shm(), in, out, bytes, root, c);
    return m.tcp(p->all(), in, out, bytes, root, c);
  }, exec);
}

}  // namespace

Communicator::WorkPtr Communicator::AllGather(const void* in, void* out, size_t count,
                                              DataType t, Exec exec) {
  return IssueMovement(*impl_, size_, kAllGather, in, out, count, t, -1, exec);
}

Communicator::WorkPtr Communicator::AllToAll(const void* in, void* out, size_t count,
                                             DataType t, Exec exec) {
  return IssueMovement(*impl_, size_, kAllToAll, in, out, count, t, -1, exec);
}

Communicator::WorkPtr Communicator::Gather(const void* in, void* out, size_t count, DataType t,
                                           int root, Exec exec) {
  return IssueMovement(*impl_, size_, kGather, in, out, count, t, root, exec);
}

Communicator::WorkPtr Communicator::Scatter(const void* in, void* out, size_t count, DataType t,
                                            int root, Exec exec) {
  return IssueMovement(*impl_, size_, kScatter, in, out, count, t, root, exec);
}

Communicator::WorkPtr Communicator::Barrier(Exec exec) {
  OpDesc d{0, OpKind::kBarrier, DataType::kU8, ReduceOp::kSum, 0, -1, 0};
  Impl* impl = impl_.get();
  return impl_->Issue(d, [=](Call& c) {
    if (impl->size() == 1) return Status::Ok();
    if (impl->UseShm()) return ShmBarrier(impl->shm(), c);
    return TcpBarrier(impl->all(), c);
  }, exec);
}

Communicator::WorkPtr Communicator::Send(const void* buf, size_t count, DataType t, int peer,
                                         int tag, Exec exec) {
  if (Status s = ValidRoot(peer, size_, "send peer"); !s.ok()) return impl_->Failed(s);
  if (peer == rank_) return impl_->Failed(InvalidArgument("rank {} cannot send to itself", peer));
  OpDesc d{0, OpKind::kSend, t, ReduceOp::kSum, 0, tag, count};
  Impl* impl = impl_.get();
  const size_t bytes = count * DataTypeSize(t);
  return impl_->Issue(d, [=](Call& c) { return impl->SendTo(peer, buf, bytes, c); }, exec, true,
                      peer);
}

Communicator::WorkPtr Communicator::Recv(void* buf, size_t count, DataType t, int peer, int tag,
                                         Exec exec) {
  if (Status s = ValidRoot(peer, size_, "recv peer"); !s.ok()) return impl_->Failed(s);
  if (peer == rank_) {
    return impl_->Failed(InvalidArgument("rank {} cannot receive from itself", peer));
  }
  OpDesc d{0, OpKind::kSend, t, ReduceOp::kSum, 0, tag, count};
  Impl* impl = impl_.get();
  const size_t bytes = count * DataTypeSize(t);
  return impl_->Issue(d, [=](Call& c) { return impl->RecvFrom(peer, buf, bytes, c); }, exec,
                      false, peer);
}

}  // namespace cohort::comm
