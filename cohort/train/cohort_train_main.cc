// cohort-train: data-parallel training of an image classifier on libtorch with cohort's
// collectives. Under `cohort run` every worker joins one Communicator of WORLD_SIZE ranks
// through the job's store (the worker environment, cohort/base/worker_env.h); run by hand
// it trains as a single process. A worker of several ranks that cannot join exits with
// code 10 and says why: it never trains alone by accident.
//
//   cohort run --nproc-per-node 2 -- cohort-train --model cnn --dataset fashion-mnist
//       --data-dir /usr/share/datasets/fashion-mnist --epochs 6 --batch-size 64
//       --checkpoint-dir /tmp/ckpt
//
// Each run is deterministic for a given seed and world size (model init from --seed, data
// order from the sampler, bit-identical allreduce), including across a kill and resume:
// checkpoints are taken at step boundaries and restore parameters, optimizer state, sampler
// position and torch's generator. A checkpoint is a snapshot in memory (train/snapshot_store.h:
// training waits only for one copy of the state), taken by local rank 0 of every node into
// the node's snapshot directory when `cohort run` offers one (it outlives the workers), and
// written to --checkpoint-dir by rank 0 in the background. On start every rank finds the
// newest valid snapshot or checkpoint on its node, and the newest of all ranks is given to
// the others by broadcast: no shared file system is needed. Every rank prints `rank R of W: transport T, round N` once joined; rank 0 prints
// progress and `test_accuracy <x>`; finally every rank prints `rank R param_digest <crc32 of
// all parameters>` and rank 0 also `param_digest <crc32>`. With --tensorboard-dir, rank 0 also writes
// TensorBoard scalars (docs/tensorboard.md).
//
// Under `cohort run` across nodes it keeps its process through a node loss or join (live
// reconfiguration, docs/multinode.md): the step in flight is dropped, the communicator
// re-forms at the new rank and world size, the sampler is re-partitioned from the current
// position, and the ranks agree on the newest in-memory state (a newcomer receives it by
// broadcast, not from the checkpoint); every rank then prints its `rank R of W` line again
// and `rank R: re-formed live in N ms at step S (pid P)`.
//
// Exit codes (cohort/base/exit_codes.h): 0 ok, 2 usage (unknown flag, model, data set or
// optimizer), 10 could not join the job (worker_env.h), 11 data set missing or malformed,
// 12 checkpoint from another model/optimizer/seed, 13 communication failure, 70 internal
// error (torch, I/O).
// Nothing is written before inputs are validated.
//
// Test hooks, in the first attempt only (TORCHELASTIC_RESTART_COUNT=0): with
// COHORT_TRAIN_FAULT_RANK=r and COHORT_TRAIN_FAULT_STEP=s, rank r SIGKILLs itself before
// step s; with COHORT_TRAIN_FAULT_WRITE_STEP=s, rank 0 SIGKILLs itself half-way through
// writing step s's checkpoint file.
//
// Thread-safety: a program; the main thread trains, one loader thread prefetches batches.
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cohort/base/exit_codes.h"
#include "cohort/base/log.h"
#include "cohort/base/settings.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/comm/communicator.h"
#include "cohort/comm/live_membership.h"
#include "cohort/metrics/exporter.h"
#include "cohort/metrics/tensorboard.h"
#include "cohort/train/state_codec.h"
#include "cohort/train/snapshot_store.h"
#include "cohort/train/data.h"
#include "cohort/train/ddp.h"
#include "cohort/train/models.h"
#include "cohort/train/sampler.h"

namespace cohort::train {
namespace {


struct Flags {
  std::string model = "cnn";
  std::string dataset = "fashion-mnist";
  std::string data_dir;
  int epochs = 1;
  int batch_size = 64;
  double lr = 0.05;
  std::string optimizer = "sgd";
  double momentum = 0.9;
  double weight_decay = 0.0;
  uint64_t seed = 1234;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  int keep = 3;
  int64_t log_every = 50;
  std::string metrics_file;
  std::string tensorboard_dir;
  int64_t max_steps = 0;
  bool bf16_grads = false;
  std::string grad_compression = "none";
  std::string tag;
};

class Exit : public std::exception {
 public:
  Exit(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code() const { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int code_;
  std::string message_;
};

void Require(const Status& st, int code, std::string_view what) {
  if (!st.ok()) throw Exit(code, fmt::format("{}: {}", what, st.ToString()));
}

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string Join(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, ", "));
}

std::string Hms(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02d}m{:02d}s", s / 3600, (s / 60) % 60, s % 60);
  if (s >= 60) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

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

void ConfigureThreads() {
  const int threads = OmpThreadsOfThisProcess();
  at::set_num_threads(threads > 0 ? threads : 1);
  try {
    at::set_num_interop_threads(1);
  } catch (const c10::Error&) {
    // already started: keep torch's choice
  }
}

class MetricsWriter {
 public:
  // Creates the file's directory, as for --checkpoint-dir and --tensorboard-dir.
  explicit MetricsWriter(const std::string& path) {
    if (path.empty()) return;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) {
      throw Exit(kExitUsage, fmt::format("cannot create the directory of --metrics-file {}: {}",
                                         path, ec.message()));
    }
    out_.open(path, std::ios::app);
    if (!out_) {
      throw Exit(kExitUsage, fmt::format("cannot open --metrics-file {}: {}", path,
                                         std::strerror(errno)));
    }
  }
  void Write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

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

void ValidateFlags(const Flags& f) {
  if (!Contains(ModelNames(), f.model)) {
    throw Exit(kExitUsage, fmt::format("unknown --model '{}' (choose one of: {})", f.model,
                                       Join(ModelNames())));
  }
  if (!Contains(DatasetNames(), f.dataset)) {
    throw Exit(kExitUsage, fmt::format("unknown --dataset '{}' (choose one of: {})", f.dataset,
                                       Join(DatasetNames())));
  }
  if (f.optimizer != "sgd" && f.optimizer != "adam") {
    throw Exit(kExitUsage,
               fmt::format("unknown --optimizer '{}' (choose sgd or adam)", f.optimizer));
  }
  if (f.batch_size < 1 || f.epochs < 0 || f.keep < 1 || f.lr <= 0) {
    throw Exit(kExitUsage, "--batch-size and --keep must be >= 1, --epochs >= 0, --lr > 0");
  }
  if (f.dataset != "synthetic" && f.data_dir.empty()) {
    throw Exit(kExitUsage, fmt::format("--data-dir is required for --dataset {}", f.dataset));
  }
}

Dataset LoadOrExit(const Flags& f, bool train) {
  Result<Dataset> d = LoadDataset(f.dataset, f.data_dir, train, f.seed);
  Require(d.status(), kExitData, train ? "loading the training set" : "loading the test set");
  return std::move(*d);
}

// This process's place in the job: the communicator of every rank of WORLD_SIZE, or none
// for a world of one (run by hand, or one worker: no collectives); and, when the agent
// offers it, the channel through which the membership changes without a restart.
struct Membership {
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<comm::LiveMembership> live;  // after comm: stops watching first
  int rank = 0;
  int world = 1;
  Result<WorkerEnv> launched = Status(StatusCode::kNotFound, "not started by a launcher");
  bool leader() const { return rank == 0; }
};

Membership JoinJob() {
  Membership m;
  auto c = comm::Communicator::FromEnvironment();
  Require(c.status(), kExitCannotJoinJob, "cannot join the job's communicator");
  m.launched = ReadWorkerEnv();  // FromEnvironment validated it; not ok when run by hand
  // A world of one keeps its communicator when it may grow (live reconfiguration).
  const bool may_change = m.launched.ok() && !m.launched->membership_dir.empty();
  if ((*c)->size() > 1 || may_change) m.comm = std::move(*c);
  if (may_change) {
    auto live = comm::LiveMembership::Start(*m.launched, m.comm.get());
    Require(live.status(), kExitCannotJoinJob, "cannot watch the membership channel");
    m.live = std::move(*live);
  }
  m.rank = m.comm ? m.comm->rank() : 0;
  m.world = m.comm ? m.comm->size() : 1;
  fmt::print("rank {} of {}: transport {}, round {}\n", m.rank, m.world,
             m.comm ? m.comm->topology() : "self", m.launched.ok() ? m.launched->round : 0);
  std::fflush(stdout);
  return m;
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

// Rank 0's console line, JSON metrics record and TensorBoard scalars, and every rank's own
// gauges for the agent's /metrics (exporter.h). Optional outputs fail soft: a TensorBoard
// write error warns once and training goes on.
class Reporter {
 public:
  Reporter(const Flags& f, bool leader)
      : f_(f), leader_(leader), file_(leader ? f.metrics_file : "") {
    if (!leader || f.tensorboard_dir.empty()) return;
    auto w = metrics::EventWriter::Open(f.tensorboard_dir);
    if (w.ok()) {
      tensorboard_ = std::move(*w);
    } else {
      Warn(w.status());
    }
  }

  struct Window {
    int64_t step, total_steps, per_epoch, shown_epoch, shown_batch;
    double epoch_progress;  // epochs done, fractional
    double loss, seconds, comm_wait_seconds, elapsed_seconds;
    double steps;       // in this window
    double steps_done;  // since this process started training
    int world;
  };

  void Progress(const Window& w) {
    auto& reg = metrics::DefaultRegistry();
    const double window = std::max(w.seconds, 1e-9);
    reg.GetGauge("cohort_train_step", "Optimizer steps done").Set(double(w.step));
    reg.GetGauge("cohort_train_epoch", "Epochs done (fractional)")
        .Set(double(w.step) / double(std::max<int64_t>(w.per_epoch, 1)));
    reg.GetGauge("cohort_train_loss", "Mean training loss over the last window, all ranks")
        .Set(w.loss);
    reg.GetGauge("cohort_train_samples_per_second", "Samples this rank trained per second")
        .Set(w.steps * double(f_.batch_size) / window);
    reg.GetGauge("cohort_train_comm_wait_fraction",
                 "Share of the last window spent waiting for gradient allreduce")
        .Set(w.comm_wait_seconds / window);
    reg.GetHistogram("cohort_train_step_seconds", "Time per optimizer step (window mean)",
                     metrics::SecondsBuckets())
        .Observe(window / std::max(w.steps, 1.0));
    if (!leader_) return;
    const double sps = w.steps * double(f_.batch_size) * w.world / window;
    const double eta = w.elapsed_seconds / std::max(w.steps_done, 1.0) *
                       double(w.total_steps - w.step);
    fmt::print("epoch {}/{} step {}/{} (batch {}/{}) loss {:.4f} samples/s {:.0f} "
               "comm_wait {:.1f}% eta {}\n",
               w.shown_epoch, f_.epochs, w.step, w.total_steps, w.shown_batch, w.per_epoch,
               w.loss, sps, 100.0 * w.comm_wait_seconds / window, Hms(eta));
    std::fflush(stdout);
    file_.Write({{"event", "step"},
                 {"step", w.step},
                 {"epoch", w.shown_epoch},
                 {"loss", w.loss},
                 {"samples_per_s", sps},
                 {"comm_wait_s", w.comm_wait_seconds},
                 {"window_s", w.seconds},
                 {"elapsed_s", w.elapsed_seconds},
                 {"world_size", w.world}});
    Scalars(w.step, {{"train/loss", w.loss},
                     {"train/samples_per_s", sps},
                     {"train/comm_wait_fraction", w.comm_wait_seconds / window},
                     {"train/epoch", w.epoch_progress}});
  }

  void End(int64_t step, double accuracy, double train_seconds, double comm_wait_seconds,
           const std::string& digest) {
    if (!leader_) return;
    file_.Write({{"event", "end"},
                 {"step", step},
                 {"test_accuracy", accuracy},
                 {"train_s", train_seconds},
                 {"comm_wait_s", comm_wait_seconds},
                 {"param_digest", digest}});
    Scalars(step, {{"test/accuracy", accuracy}});
    tensorboard_.reset();  // flushes and closes
  }

 private:
  void Scalars(int64_t step, std::initializer_list<std::pair<const char*, double>> scalars) {
    if (!tensorboard_) return;
    Status st;
    for (const auto& [tag, value] : scalars) {
      if (st.ok()) st = tensorboard_->AddScalar(tag, step, value);
    }
    if (st.ok()) st = tensorboard_->Flush();
    if (!st.ok()) {
      Warn(st);
      tensorboard_.reset();
    }
  }
  static void Warn(const Status& st) {
    fmt::print(stderr, "cohort-train: warning: --tensorboard-dir: {}; continuing without it\n",
               st.ToString());
  }

  const Flags& f_;
  const bool leader_;
  MetricsWriter file_;
  std::unique_ptr<metrics::EventWriter> tensorboard_;
};

// One training run, in the order Run() calls its steps: join the job, build the model,
// resume, train, evaluate.
class Trainer {
 public:
  Trainer(const Flags& f, Dataset train_set, Dataset test_set, Membership job)
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

  int Run() {
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

 private:
  // Every rank restores the newest valid snapshot or checkpoint it finds on its node (the
  // node's snapshot directory, --checkpoint-dir); then the newest of all ranks is given to
  // the others (ShareState), so a rank on a node that lost everything, or a job without a
  // shared file system, resumes at the job's newest step.
  void Resume() {
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

  void MakeDdp() {
    auto ddp = DistributedDataParallel::Create(model_, job_.comm.get(), DdpOptionsOf(f_));
    Require(ddp.status(), kExitComm, "setting up data parallelism");
    ddp_ = std::move(*ddp);
  }

  // Steps per epoch and in all for the current world size, from the current position.
  void Repartitioned() {
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
  double CommWait() const {
    return comm_wait_before_ + (ddp_ ? ddp_->stats().comm_wait_seconds : 0);
  }

  // After joining or re-forming: the ranks that hold the newest training state in memory
  // give it to the others (newcomers, or survivors that missed the step in flight) by
  // broadcast from the lowest of them, as checkpoint bytes (checksummed); then every rank
  // checks that the parameters agree (CRC32). False when no rank holds any state (a job
  // that starts: the checkpoint decides). Every rank issues the same collectives.
  bool ShareState(bool has_state, bool from_checkpoint = false) {
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
  void Reconfigure(Status why) {
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

  void Announce() const {
    if (!job_.leader()) return;
    int64_t num_params = 0;
    for (const auto& p : model_->parameters()) num_params += p.numel();
    fmt::print("training {} ({} parameters) on {} ({} samples, {} test) with {} worker(s), "
               "batch {} per worker, {} steps per epoch, {} steps in all, {} lr {}\n",
               f_.model, num_params, f_.dataset, train_set_.size(), test_set_.size(), job_.world,
               f_.batch_size, per_epoch_, total_steps_, f_.optimizer, f_.lr);
    std::fflush(stdout);
  }

  void Train() {
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
  Result<bool> Step(const Batch& batch) {
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
  Status Report(bool epoch_end) {
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
  void MakeSnapshotStore() {
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
  void Snapshot() {
    if (!snapshots_) return;
    auto plan = codec_.PlanEncoding(state_, *model_, optimizer_.get());
    Require(plan.status(), kExitInternal, "snapshot");
    Status taken = snapshots_->Take(
        state_.global_step, plan->meta, plan->payload_size,
        [&](char* payload, uint32_t crc) { return plan->Fill(payload, crc); });
    if (!taken.ok()) COHORT_LOG_WARN("train", "no snapshot: {}", taken.message());
  }

  // Test accuracy (rank 0's buffers, the test set split across ranks) and the digests.
  void Finish() {
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

  static Deadline CommDeadline() { return Deadline::AfterMs(300000); }

  const Flags& f_;
  Dataset train_set_;
  Dataset test_set_;
  Membership job_;
  DistributedSampler sampler_;
  TrainState state_;
  std::shared_ptr<Classifier> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::string snapshot_dir_;  // the node's (COHORT_SNAPSHOT_DIR); empty: none
  std::unique_ptr<SnapshotStore> snapshots_;
  int state_source_ = -1;  // the rank the last ShareState took the state from (-1: none)
  StateCodec codec_;  // the state's encoding: snapshots, checkpoints, a newcomer's copy
  double comm_wait_before_ = 0;  // gradient-allreduce wait of the DDPs before this one
  bool reconfigured_ = false;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Reporter> reporter_;
  int64_t per_epoch_ = 0;
  int64_t total_steps_ = 0;
  int64_t first_step_ = 0;
  SteadyClock::time_point t_start_, t_window_;
  double train_seconds_ = 0;
  double window_wait_ = 0;
  double loss_sum_ = 0;
  int64_t loss_count_ = 0;
  int64_t window_steps_ = 0;
};

int Run(const Flags& f) {
  ValidateFlags(f);  // before touching anything
  ConfigureThreads();
  // Data before joining the job: a bad directory fails fast on every rank.
  Dataset train_set = LoadOrExit(f, /*train=*/true);
  Dataset test_set = LoadOrExit(f, /*train=*/false);
  return Trainer(f, std::move(train_set), std::move(test_set), JoinJob()).Run();
}

}  // namespace
}  // namespace cohort::train

int main(int argc, char** argv) {
  using cohort::train::Flags;
  Flags f;
  CLI::App app{"cohort-train: data-parallel image classification on libtorch"};
  app.add_option("--model", f.model, "mlp | cnn | resnet18 | resnet50")->capture_default_str();
  app.add_option("--dataset", f.dataset, "fashion-mnist | mnist | cifar10 | synthetic")
      ->capture_default_str();
  app.add_option("--data-dir", f.data_dir, "directory of the data set files");
  app.add_option("--epochs", f.epochs, "epochs to train")->capture_default_str();
  app.add_option("--batch-size", f.batch_size, "batch size per worker")->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "sgd | adam")->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "L2 penalty")->capture_default_str();
  app.add_option("--seed", f.seed, "seed of weights and data order")->capture_default_str();
  app.add_option("--checkpoint-dir", f.checkpoint_dir,
                 "checkpoint directory (rank 0 writes it in the background); the newest valid "
                 "checkpoint or in-memory snapshot is resumed");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "snapshot every N steps and at the end (0: only at the end): kept in the "
                 "node's memory under cohort run, written to --checkpoint-dir")
      ->capture_default_str();
  app.add_option("--keep", f.keep, "checkpoints kept")->capture_default_str();
  app.add_option("--log-every", f.log_every, "progress line every N steps")->capture_default_str();
  app.add_option("--metrics-file", f.metrics_file, "JSON lines of progress (rank 0)");
  app.add_option("--tensorboard-dir", f.tensorboard_dir,
                 "write TensorBoard scalars (rank 0) to an event file in DIR");
  app.add_option("--max-steps", f.max_steps, "stop after N steps in all (0: no limit)")
      ->capture_default_str();
  app.add_flag("--bf16-grads", f.bf16_grads, "allreduce gradients as bf16 (= --grad-compression bf16)");
  app.add_option("--grad-compression", f.grad_compression, "none, bf16 or fp16 gradients on the wire")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  app.add_option("--tag", f.tag, "free text, ignored (to find the run in ps)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "cohort-train: %s (see --help)\n", e.what());
    return cohort::kExitUsage;
  }
  // Under `cohort run --metrics-port`, export this rank's metrics for the agent.
  cohort::metrics::StartWorkerExporter();
  try {
    return cohort::train::Run(f);
  } catch (const cohort::train::Exit& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "cohort-train: error: %s\n", e.what());
    return e.code();
  } catch (const c10::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "cohort-train: torch error: %s\n", e.what_without_backtrace());
    return cohort::kExitInternal;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "cohort-train: error: %s\n", e.what());
    return cohort::kExitInternal;
  }
}
