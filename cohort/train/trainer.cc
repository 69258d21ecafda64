// Trainer (see trainer.h): resume, the training loop, live reconfiguration, the final
// evaluation. Thread-safety: single owner thread (trainer.h).
#include "cohort/train/trainer.h"

#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "cohort/base/exit_codes.h"
#include "cohort/base/log.h"
#include "cohort/base/settings.h"
#include "cohort/train/train_report.h"

namespace cohort::train {
namespace {

// CRC32 over the raw bytes of every parameter, in registration order.
uint32_t ParamCrc(torch::nn::Module& model) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (auto& p : model.named_parameters(true)) {
    torch::Tensor t = p.value().detach().contiguous();
    crc = crc32(crc, static_cast<const Bytef*>(t.data_ptr()),
                static_cast<uInt>(t.numel() * t.element_size()));
  }
  return static_cast<uint32_t>(crc);
}

std::string ParamDigest(torch::nn::Module& model) {
  return fmt::format("{:08x}", ParamCrc(model));
}

// Evaluates on the test set, split across ranks; returns (correct, total) over all ranks.
std::pair<int64_t, int64_t> Evaluate(Classifier& model, const Dataset& test,
                                     comm::Communicator* comm, int rank, int world) {
  torch::NoGradGuard no_grad;
  model.eval();
  int64_t counts[2] = {0, 0};
  std::vector<size_t> mine;
  for (size_t i = rank; i < test.size(); i += world) mine.push_back(i);
  constexpr size_t kEvalBatch = 500;
  for (size_t off = 0; off < mine.size(); off += kEvalBatch) {
    std::vector<size_t> idx(mine.begin() + off,
                            mine.begin() + std::min(mine.size(), off + kEvalBatch));
    auto [x, y] = test.Gather(idx);
    torch::Tensor pred = model.forward(x).argmax(1);
    counts[0] += pred.eq(y).sum().item<int64_t>();
    counts[1] += static_cast<int64_t>(idx.size());
  }
  if (comm != nullptr) {
    Require(comm->AllReduce(counts, counts, 2, comm::DataType::kI64, comm::ReduceOp::kSum)
                ->Wait(Deadline::AfterMs(300000)),
            kExitComm, "evaluation allreduce");
  }
  model.train();
  return {counts[0], counts[1]};
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const Flags& f, Classifier& model) {
  if (f.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        model.parameters(),
        torch::optim::SGDOptions(f.lr).momentum(f.momentum).weight_decay(f.weight_decay));
  }
  return std::make_unique<torch::optim::Adam>(
      model.parameters(), torch::optim::AdamOptions(f.lr).weight_decay(f.weight_decay));
}

DdpOptions DdpOptionsOf(const Flags& f) {
  DdpOptions o;
  if (f.bf16_grads || f.grad_compression == "bf16") {
    o.compression = GradCompression::kBf16;
  } else if (f.grad_compression == "fp16") {
    o.compression = GradCompression::kFp16;
  }
  return o;
}

// A checkpoint's position at another world size or batch: the number of samples consumed
// this epoch is kept, rounded down to a whole batch of the new job.
TrainState Rescaled(TrainState restored, int world, int batch_size) {
  int64_t consumed = restored.batch_in_epoch * restored.batch_size * restored.world_size;
  COHORT_LOG_WARN("train",
                  "training state from world size {} batch {}; continuing with world size {} "
                  "batch {} at batch {} of epoch {} (not bit-identical to either run)",
                  restored.world_size, restored.batch_size, world, batch_size,
                  consumed / (int64_t{batch_size} * world), restored.epoch);
  restored.batch_in_epoch = consumed / (int64_t{batch_size} * world);
  restored.world_size = world;
  restored.batch_size = batch_size;
  return restored;
}

}  // namespace

void Require(const Status& st, int code, std::string_view what) {
  if (!st.ok()) throw Exit(code, fmt::format("{}: {}", what, st.ToString()));
}

Trainer::Trainer(const Flags& f, Dataset train_set, Dataset test_set, Membership job)
    : f_(f),
      train_set_(std::move(train_set)),
      test_set_(std::move(test_set)),
      job_(std::move(job)),
      sampler_(train_set_.size(), job_.rank, job_.world, f.batch_size,
               SamplerOptions{.seed = f.seed}),
      state_{.seed = f.seed, .world_size = job_.world, .batch_size = f.batch_size},
      codec_(f.model, f.optimizer) {
  if (!job_.leader()) log::SetLevel("warn");
  torch::manual_seed(f.seed);  // identical initial parameters on every rank
  auto model = MakeModel(f.model, train_set_.shape());
  Require(model.status(), kExitUsage, "building the model");
  model_ = *model;
  optimizer_ = MakeOptimizer(f, *model_);
  snapshot_dir_ = job_.launched.ok() ? job_.launched->snapshot_dir : "";
  MakeSnapshotStore();
}

Trainer::~Trainer() = default;

int Trainer::Run() {
  // A newcomer to a running job takes the state the others hold in memory; a job that
  // starts (or restarts) takes the newest snapshot or checkpoint any rank finds.
  if (!ShareState(/*has_state=*/false)) Resume();
  MakeDdp();
  Repartitioned();
  Announce();
  reporter_ = std::make_unique<Reporter>(f_, job_.leader());
  Train();
  Finish();
  if (snapshots_) {  // the program ends when the final checkpoint is on disk
    Require(snapshots_->Flush(Deadline::AfterMs(600000)), kExitCheckpoint,
            "writing the final checkpoint");
  }
  return kExitOk;
}

// Every rank restores the newest valid snapshot or checkpoint it finds on its node (the
// node's snapshot directory, --checkpoint-dir); then the newest of all ranks is given to
// the others (ShareState), so a rank on a node that lost everything, or a job without a
// shared file system, resumes at the job's newest step.
void Trainer::Resume() {
  Result<FoundSnapshot> found = NewestSnapshot(snapshot_dir_, f_.checkpoint_dir);
  int64_t restored_step = -1;
  std::string where;
  if (found.ok()) {
    // Straight from the mapped file into the model: no copy of the file in between.
    Result<TrainState> loaded =
        codec_.Decode(found->view, found->path, *model_, optimizer_.get());
    Require(loaded.status(), kExitCheckpoint, "restoring the training state");
    Require(found->Recheck(), kExitCheckpoint, "restoring the training state");
    if (loaded->seed != f_.seed) {
      throw Exit(kExitCheckpoint, fmt::format("checkpoint {} was trained with --seed {}, not {}",
                                              found->path, loaded->seed, f_.seed));
    }
    state_ = *loaded;
    restored_step = state_.global_step;
    where = found->where;
  } else if (found.status().code() != StatusCode::kNotFound) {
    throw Exit(kExitCheckpoint, found.status().message());
  }
  if (!ShareState(restored_step >= 0, /*from_checkpoint=*/true)) return;
  if (state_.world_size != job_.world || state_.batch_size != f_.batch_size) {
    state_ = Rescaled(state_, job_.world, f_.batch_size);
  }
  // Said by the rank whose copy the job resumed from (rank 0 when it held the newest).
  if (restored_step == state_.global_step && (job_.leader() || state_source_ == job_.rank)) {
    fmt::print("{}resumed from {} at step {} (epoch {}, batch {})\n",
               job_.leader() ? "" : fmt::format("rank {}: ", job_.rank), where,
               state_.global_step, state_.epoch + 1, state_.batch_in_epoch);
    std::fflush(stdout);
  }
}

void Trainer::MakeDdp() {
  auto ddp = DistributedDataParallel::Create(model_, job_.comm.get(), DdpOptionsOf(f_));
  Require(ddp.status(), kExitComm, "setting up data parallelism");
  ddp_ = std::move(*ddp);
}

// Steps per epoch and in all for the current world size, from the current position.
void Trainer::Repartitioned() {
  per_epoch_ = static_cast<int64_t>(sampler_.batches_per_epoch());
  if (state_.batch_in_epoch >= per_epoch_) {
    ++state_.epoch;
    state_.batch_in_epoch = 0;
  }
  total_steps_ = state_.global_step + (per_epoch_ - state_.batch_in_epoch) +
                 per_epoch_ * std::max<int64_t>(f_.epochs - state_.epoch - 1, 0);
  if (state_.epoch >= f_.epochs) total_steps_ = state_.global_step;
  if (f_.max_steps > 0) total_steps_ = std::min(total_steps_, f_.max_steps);
}

// Time spent waiting for gradient allreduce, over every DDP this process made.
double Trainer::CommWait() const {
  return comm_wait_before_ + (ddp_ ? ddp_->stats().comm_wait_seconds : 0);
}

// After joining or re-forming: the ranks that hold the newest training state in memory
// give it to the others (newcomers, or survivors that missed the step in flight) by
// broadcast from the lowest of them, as checkpoint bytes (checksummed); then every rank
// checks that the parameters agree (CRC32). False when no rank holds any state (a job
// that starts: the checkpoint decides). Every rank issues the same collectives.
bool Trainer::ShareState(bool has_state, bool from_checkpoint) {
  state_source_ = -1;
  if (!job_.comm || job_.comm->size() == 1) return has_state;
  comm::Communicator& c = *job_.comm;
  const int64_t mine = has_state ? state_.global_step : -1;
  int64_t range[2] = {mine, -mine};  // max of both: the newest step and the oldest
  Require(c.AllReduce(range, range, 2, comm::DataType::kI64, comm::ReduceOp::kMax)
              ->Wait(CommDeadline()),
          kExitComm, "agreeing on the training state");
  const int64_t newest = range[0], oldest = -range[1];
  if (newest < 0) return false;
  if (oldest != newest) {
    int64_t source = mine == newest ? job_.rank : job_.world;
    Require(c.AllReduce(&source, &source, 1, comm::DataType::kI64, comm::ReduceOp::kMin)
                ->Wait(CommDeadline()),
            kExitComm, "choosing the rank that sends the training state");
    state_source_ = static_cast<int>(source);
    std::string bytes;
    if (job_.rank == source) {
      auto blob = codec_.Encode(state_, *model_, optimizer_.get());
      Require(blob.status(), kExitInternal, "encoding the training state");
      bytes = EncodeCheckpoint(*blob);
    }
    int64_t size = static_cast<int64_t>(bytes.size());
    Require(c.Broadcast(&size, 1, comm::DataType::kI64, static_cast<int>(source))
                ->Wait(CommDeadline()),
            kExitComm, "sending the training state");
    bytes.resize(static_cast<size_t>(size));
    Require(c.Broadcast(bytes.data(), bytes.size(), comm::DataType::kU8,
                        static_cast<int>(source))
                ->Wait(CommDeadline()),
            kExitComm, "sending the training state");
    if (job_.rank != source) {
      const std::string what = fmt::format("the training state from rank {}", source);
      auto blob = DecodeCheckpoint(bytes, what);
      Require(blob.status(), kExitComm, "receiving the training state");
      auto received = codec_.Decode(std::move(*blob), what, *model_, optimizer_.get());
      Require(received.status(), kExitComm, "receiving the training state");
      state_ = *received;
    }
    if (job_.leader()) {
      fmt::print("training state of step {} sent by rank {} ({} bytes) to the ranks that "
                 "did not hold {}\n",
                 newest, source, size, from_checkpoint ? "a copy as new" : "it");
    }
  }
  const int64_t crc = ParamCrc(*model_);
  int64_t crcs[2] = {crc, -crc};
  Require(c.AllReduce(crcs, crcs, 2, comm::DataType::kI64, comm::ReduceOp::kMax)
              ->Wait(CommDeadline()),
          kExitComm, "comparing parameters");
  if (crcs[0] != -crcs[1]) {
    throw Exit(kExitComm, fmt::format("the ranks' parameters differ after forming the group "
                                      "(digests {:08x} and {:08x})",
                                      crcs[0], -crcs[1]));
  }
  return true;
}

// Live reconfiguration (docs/multinode.md): the membership changed while this process
// trains (`why`: the collective that failed, or the notice). Waits for the agent's new
// membership (reporting a lost peer first), re-forms the communicator there, re-partitions
// the data from the current position, and agrees on the state with the other ranks (a
// newcomer receives it). Without the channel, `why` is fatal as before.
void Trainer::Reconfigure(Status why) {
  if (!job_.live) Require(why, kExitComm, "collective");
  const auto started = SteadyClock::now();
  // Twice the agent's deadline: the agent decides whether the group restarts (and says
  // why); this only bounds the wait when the agent itself is gone.
  const Deadline deadline = Deadline::After(std::chrono::duration_cast<Duration>(
      std::chrono::duration<double>(2 * settings::kReconfigTimeout.Get())));
  for (;;) {
    Require(job_.live->AwaitChange(why, deadline).status(), kExitComm,
            "waiting for the new membership");
    why = job_.live->Reform(deadline);
    if (why.ok()) break;
    COHORT_LOG_WARN("train", "the group did not form: {}", why.message());
  }
  reconfigured_ = true;  // ranks moved: the injected fault belonged to the first group
  comm_wait_before_ = CommWait();
  ddp_.reset();  // its hooks and buckets belong to the old group
  const bool was_leader = job_.leader();
  job_.rank = job_.comm->rank();
  job_.world = job_.comm->size();
  if (job_.world != state_.world_size) state_ = Rescaled(state_, job_.world, f_.batch_size);
  sampler_ = DistributedSampler(train_set_.size(), job_.rank, job_.world, f_.batch_size,
                                SamplerOptions{.seed = f_.seed});
  ShareState(/*has_state=*/true);
  MakeDdp();
  Repartitioned();
  MakeSnapshotStore();  // rank 0 (who writes to disk) may be another process now
  if (was_leader != job_.leader()) {
    log::SetLevel(job_.leader() ? "info" : "warn");
    reporter_ = std::make_unique<Reporter>(f_, job_.leader());
  }
  fmt::print("rank {} of {}: transport {}, round {}\n", job_.rank, job_.world,
             job_.comm->topology(), job_.live->round());
  fmt::print("rank {}: re-formed live in {:.0f} ms at step {} (pid {})\n", job_.rank,
             SecondsSince(started) * 1000, state_.global_step, ::getpid());
  std::fflush(stdout);
  loss_sum_ = 0;
  loss_count_ = 0;
}

void Trainer::Announce() const {
  if (!job_.leader()) return;
  int64_t num_params = 0;
  for (const auto& p : model_->parameters()) num_params += p.numel();
  fmt::print("training {} ({} parameters) on {} ({} samples, {} test) with {} worker(s), "
             "batch {} per worker, {} steps per epoch, {} steps in all, {} lr {}\n",
             f_.model, num_params, f_.dataset, train_set_.size(), test_set_.size(), job_.world,
             f_.batch_size, per_epoch_, total_steps_, f_.optimizer, f_.lr);
  std::fflush(stdout);
}

void Trainer::Train() {
  int64_t fault_rank = -1, fault_step = -1;
  if (job_.launched.ok() && job_.launched->restart_count == 0) {
    fault_rank = settings::kTrainFaultRank.Get();
    fault_step = settings::kTrainFaultStep.Get();
  }
  model_->train();
  t_start_ = t_window_ = SteadyClock::now();
  window_wait_ = CommWait();
  first_step_ = state_.global_step;
  while (state_.global_step < total_steps_ && state_.epoch < f_.epochs) {
    sampler_.SetPosition(state_.epoch, static_cast<size_t>(state_.batch_in_epoch));
    PrefetchLoader loader(train_set_, sampler_.Batches(sampler_.position()), state_.epoch,
                          sampler_.position());
    while (state_.global_step < total_steps_) {
      // A new membership (a node joined or was lost): re-form between steps.
      if (job_.live && job_.live->Pending()) {
        Reconfigure(Status(StatusCode::kAborted, "a new membership was announced"));
        break;  // the loader restarts from the re-partitioned position
      }
      std::optional<Batch> batch = loader.Next();
      if (!batch) break;
      if (job_.rank == fault_rank && state_.global_step == fault_step && !reconfigured_) {
        fmt::print("rank {}: injecting SIGKILL at step {}\n", job_.rank, state_.global_step);
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      Result<bool> stepped = Step(*batch);
      if (!stepped.ok()) {
        Reconfigure(stepped.status());  // the step in flight is lost, and done again
        break;
      }
      const bool epoch_end = *stepped;
      if (f_.checkpoint_every > 0 && state_.global_step % f_.checkpoint_every == 0) Snapshot();
      if ((f_.log_every > 0 && state_.global_step % f_.log_every == 0) ||
          state_.global_step == total_steps_ || epoch_end) {
        if (Status reported = Report(epoch_end); !reported.ok()) {
          Reconfigure(reported);
          break;
        }
      }
      if (epoch_end) break;
    }
  }
  train_seconds_ = SecondsSince(t_start_);
  // The final state (a no-op when the last periodic snapshot holds it); Run writes it
  // to disk after the evaluation.
  Snapshot();
}

// One optimizer step; true when it ended the epoch. A failed gradient allreduce leaves
// the parameters as they were; it is returned when the membership may change
// (Reconfigure), fatal otherwise.
Result<bool> Trainer::Step(const Batch& batch) {
  optimizer_->zero_grad();
  torch::Tensor loss =
      torch::nn::functional::cross_entropy(model_->forward(batch.x), batch.y);
  loss.backward();
  Status synced = ddp_->FinishGradientSync();
  if (!synced.ok()) {
    if (!job_.live) Require(synced, kExitComm, "gradient synchronisation");
    return synced;
  }
  optimizer_->step();
  ++state_.global_step;
  state_.batch_in_epoch = static_cast<int64_t>(batch.index) + 1;
  loss_sum_ += loss.item<double>();
  ++loss_count_;
  ++window_steps_;
  if (state_.batch_in_epoch < per_epoch_) return false;
  ++state_.epoch;
  state_.batch_in_epoch = 0;
  return true;
}

// The window's mean loss over the ranks (every rank takes part), then the reports. The
// allreduce's failure is returned when the membership may change, fatal otherwise.
Status Trainer::Report(bool epoch_end) {
  double l[2] = {loss_sum_, static_cast<double>(loss_count_)};
  if (job_.comm) {
    Status reduced = job_.comm->AllReduce(l, l, 2, comm::DataType::kF64, comm::ReduceOp::kSum)
                         ->Wait(CommDeadline());
    if (!job_.live) Require(reduced, kExitComm, "loss allreduce");
    if (!reduced.ok()) return reduced;
  }
  loss_sum_ = 0;
  loss_count_ = 0;
  const double elapsed = SecondsSince(t_start_);
  reporter_->Progress(Reporter::Window{
      .step = state_.global_step,
      .total_steps = total_steps_,
      .per_epoch = per_epoch_,
      .shown_epoch = epoch_end ? state_.epoch : state_.epoch + 1,
      .shown_batch = epoch_end ? per_epoch_ : state_.batch_in_epoch,
      .epoch_progress = double(state_.epoch) + double(state_.batch_in_epoch) / per_epoch_,
      .loss = l[0] / std::max(l[1], 1.0),
      .seconds = SecondsSince(t_window_),
      .comm_wait_seconds = CommWait() - window_wait_,
      .elapsed_seconds = elapsed,
      .steps = double(window_steps_),
      .steps_done = double(state_.global_step - first_step_),
      .world = job_.world});
  t_window_ = SteadyClock::now();
  window_steps_ = 0;
  window_wait_ = CommWait();
  return Status::Ok();
}

// Local rank 0 of every node keeps the job's state in the node's snapshot directory (data
// parallel: every rank holds the same state); rank 0 also writes it to --checkpoint-dir.
// Called again when the ranks move (live reconfiguration).
void Trainer::MakeSnapshotStore() {
  const int local_rank = job_.launched.ok() ? job_.launched->local_rank : 0;
  const bool keep_in_memory = !snapshot_dir_.empty() && local_rank == 0;
  const bool persist = job_.leader() && !f_.checkpoint_dir.empty();
  const std::string disk_dir = persist ? f_.checkpoint_dir : "";
  if (snapshots_ && snapshots_->options().disk_dir == disk_dir) return;
  snapshots_.reset();  // finishes its write in progress
  if (!keep_in_memory && !persist) return;
  const bool first_attempt = job_.launched.ok() && job_.launched->restart_count == 0;
  snapshots_ = std::make_unique<SnapshotStore>(SnapshotStore::Options{
      .memory_dir = keep_in_memory ? snapshot_dir_ : "",
      .disk_dir = disk_dir,
      .keep = f_.keep,
      .rank = local_rank,
      .fault_write_step = first_attempt && persist ? settings::kTrainFaultWriteStep.Get() : -1});
}

// A snapshot of the state at this step boundary: training waits for one copy of it; the
// write to disk happens in the background. A failure is reported and training goes on.
void Trainer::Snapshot() {
  if (!snapshots_) return;
  auto plan = codec_.PlanEncoding(state_, *model_, optimizer_.get());
  Require(plan.status(), kExitInternal, "snapshot");
  Status taken = snapshots_->Take(
      state_.global_step, plan->meta, plan->payload_size,
      [&](char* payload, uint32_t crc) { return plan->Fill(payload, crc); });
  if (!taken.ok()) COHORT_LOG_WARN("train", "no snapshot: {}", taken.message());
}

// Test accuracy (rank 0's buffers, the test set split across ranks) and the digests.
void Trainer::Finish() {
  Require(ddp_->SyncBuffers(), kExitComm, "buffer broadcast");
  auto [correct, total] = Evaluate(*model_, test_set_, job_.comm.get(), job_.rank, job_.world);
  const double accuracy = total > 0 ? double(correct) / double(total) : 0.0;
  // Every rank's own parameters: equal digests show the ranks trained as one job.
  const std::string digest = ParamDigest(*model_);
  fmt::print("rank {} param_digest {}\n", job_.rank, digest);
  std::fflush(stdout);
  const double comm_wait = CommWait();
  if (job_.leader()) {
    const int64_t steps_run = state_.global_step - first_step_;
    fmt::print("done: {} steps in {} ({:.0f} samples/s, comm wait {:.1f}%)\n", steps_run,
               Hms(train_seconds_),
               steps_run * double(f_.batch_size) * job_.world / std::max(train_seconds_, 1e-9),
               100.0 * comm_wait / std::max(train_seconds_, 1e-9));
    fmt::print("test_accuracy {:.4f} ({}/{})\n", accuracy, correct, total);
    fmt::print("param_digest {}\n", digest);
    std::fflush(stdout);
  }
  reporter_->End(state_.global_step, accuracy, train_seconds_, comm_wait, digest);
  if (job_.comm) {
    // Nobody leaves (closing connections) while a peer still evaluates.
    Require(job_.comm->Barrier()->Wait(CommDeadline()), kExitComm, "final barrier");
  }
}

}  // namespace cohort::train
