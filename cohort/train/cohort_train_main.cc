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
// position and torch's generator. On start the newest valid checkpoint of --checkpoint-dir
// is restored. Every rank prints `rank R of W: transport T, round N` once joined; rank 0 prints
// progress and `test_accuracy <x>`; finally every rank prints `rank R param_digest <crc32 of
// all parameters>` and rank 0 also `param_digest <crc32>`. With --tensorboard-dir, rank 0 also writes
// TensorBoard scalars (docs/tensorboard.md).
//
// Exit codes: 0 ok, 2 usage (unknown flag, model, data set or optimizer), 3 data set
// missing or malformed, 4 checkpoint from another model/optimizer/seed, 5 communication
// failure, 10 could not join the job (worker_env.h), 70 internal error (torch, I/O).
// Nothing is written before inputs are validated.
//
// Test hook: with COHORT_TRAIN_FAULT_RANK=r and COHORT_TRAIN_FAULT_STEP=s in the
// environment and TORCHELASTIC_RESTART_COUNT=0, rank r SIGKILLs itself before step s.
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
#include "cohort/metrics/exporter.h"
#include "cohort/metrics/tensorboard.h"
#include "cohort/train/checkpointer.h"
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
std::string ParamDigest(torch::nn::Module& model) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (auto& p : model.named_parameters(true)) {
    torch::Tensor t = p.value().detach().contiguous();
    crc = crc32(crc, static_cast<const Bytef*>(t.data_ptr()),
                static_cast<uInt>(t.numel() * t.element_size()));
  }
  return fmt::format("{:08x}", static_cast<uint32_t>(crc));
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

int Run(const Flags& f) {
  // 1. Validate names before touching anything.
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
  ConfigureThreads();

  // 2. Data (before joining the job: a bad directory fails fast on every rank).
  Result<Dataset> train_r = LoadDataset(f.dataset, f.data_dir, /*train=*/true, f.seed);
  Require(train_r.status(), kExitData, "loading the training set");
  Result<Dataset> test_r = LoadDataset(f.dataset, f.data_dir, /*train=*/false, f.seed);
  Require(test_r.status(), kExitData, "loading the test set");
  Dataset& train_set = *train_r;
  Dataset& test_set = *test_r;

  // 3. Communicator.
  // The job's communicator: every rank of WORLD_SIZE, or this process alone when it was
  // not started by a launcher. No communicator object for a world of one (no collectives).
  std::unique_ptr<comm::Communicator> comm;
  {
    auto c = comm::Communicator::FromEnvironment();
    Require(c.status(), kExitCannotJoinJob, "cannot join the job's communicator");
    if ((*c)->size() > 1) comm = std::move(*c);
  }
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  // Read once (FromEnvironment validated it); not ok when run by hand.
  const Result<WorkerEnv> launched = ReadWorkerEnv();
  fmt::print("rank {} of {}: transport {}, round {}\n", rank, world,
             comm ? comm->topology() : "self", launched.ok() ? launched->round : 0);
  std::fflush(stdout);
  const bool leader = rank == 0;
  if (!leader) log::SetLevel("warn");

  // 4. Model and optimizer, seeded identically on every rank.
  torch::manual_seed(f.seed);
  auto model_r = MakeModel(f.model, train_set.shape());
  Require(model_r.status(), kExitUsage, "building the model");
  std::shared_ptr<Classifier> model = *model_r;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (f.optimizer == "sgd") {
    optimizer = std::make_unique<torch::optim::SGD>(
        model->parameters(),
        torch::optim::SGDOptions(f.lr).momentum(f.momentum).weight_decay(f.weight_decay));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(
        model->parameters(), torch::optim::AdamOptions(f.lr).weight_decay(f.weight_decay));
  }

  // 5. Resume from the newest valid checkpoint; every rank must pick the same step.
  DistributedSampler sampler(train_set.size(), rank, world, f.batch_size,
                             SamplerOptions{.seed = f.seed});
  TrainState state{.seed = f.seed, .world_size = world, .batch_size = f.batch_size};
  std::unique_ptr<Checkpointer> checkpointer;
  if (!f.checkpoint_dir.empty()) {
    checkpointer = std::make_unique<Checkpointer>(f.checkpoint_dir, f.model, f.optimizer, f.keep);
    Result<TrainState> loaded = checkpointer->LoadLatest(*model, optimizer.get());
    if (loaded.ok()) {
      if (loaded->seed != f.seed) {
        throw Exit(kExitCheckpoint,
                   fmt::format("checkpoint {} was trained with --seed {}, not {}",
                               checkpointer->loaded_path(), loaded->seed, f.seed));
      }
      TrainState restored = *loaded;
      if (restored.world_size != world || restored.batch_size != f.batch_size) {
        // Elastic resume: keep the number of samples consumed this epoch, rounded down.
        int64_t consumed = restored.batch_in_epoch * restored.batch_size * restored.world_size;
        restored.batch_in_epoch = consumed / (int64_t{f.batch_size} * world);
        COHORT_LOG_WARN("train",
                        "checkpoint from world size {} batch {}; resuming with world size {} "
                        "batch {} at batch {} of epoch {} (not bit-identical to either run)",
                        loaded->world_size, loaded->batch_size, world, f.batch_size,
                        restored.batch_in_epoch, restored.epoch);
        restored.world_size = world;
        restored.batch_size = f.batch_size;
      }
      state = restored;
      if (leader) {
        fmt::print("resumed from {} at step {} (epoch {}, batch {})\n",
                   checkpointer->loaded_path(), state.global_step, state.epoch + 1,
                   state.batch_in_epoch);
      }
    } else if (loaded.status().code() == StatusCode::kFailedPrecondition ||
               loaded.status().code() == StatusCode::kDataLoss) {
      throw Exit(kExitCheckpoint, loaded.status().message());
    } else if (loaded.status().code() != StatusCode::kNotFound) {
      Require(loaded.status(), kExitInternal, "reading checkpoints");
    }
  }
  if (comm) {
    int64_t step = state.global_step;
    Require(comm->Broadcast(&step, 1, comm::DataType::kI64, 0)->Wait(Deadline::AfterMs(300000)),
            kExitComm, "agreeing on the resume step");
    if (step != state.global_step) {
      throw Exit(kExitCheckpoint,
                 fmt::format("rank {} resumed at step {} but rank 0 at step {}: the checkpoint "
                             "directory must be shared and identical on every rank",
                             rank, state.global_step, step));
    }
  }

  // 6. Data-parallel wrapper (broadcasts rank 0's parameters; they already agree).
  DdpOptions ddp_options;
  if (f.bf16_grads || f.grad_compression == "bf16") {
    ddp_options.compression = GradCompression::kBf16;
  } else if (f.grad_compression == "fp16") {
    ddp_options.compression = GradCompression::kFp16;
  }
  auto ddp_r = DistributedDataParallel::Create(model, comm.get(), ddp_options);
  Require(ddp_r.status(), kExitComm, "setting up data parallelism");
  auto& ddp = **ddp_r;

  const int64_t per_epoch = static_cast<int64_t>(sampler.batches_per_epoch());
  int64_t total_steps = per_epoch * f.epochs;
  if (f.max_steps > 0) total_steps = std::min(total_steps, f.max_steps);
  if (state.batch_in_epoch >= per_epoch) {
    ++state.epoch;
    state.batch_in_epoch = 0;
  }
  if (leader) {
    int64_t num_params = 0;
    for (const auto& p : model->parameters()) num_params += p.numel();
    fmt::print("training {} ({} parameters) on {} ({} samples, {} test) with {} worker(s), "
               "batch {} per worker, {} steps per epoch, {} steps in all, {} lr {}\n",
               f.model, num_params, f.dataset, train_set.size(), test_set.size(), world, f.batch_size,
               per_epoch, total_steps, f.optimizer, f.lr);
    std::fflush(stdout);
  }

  MetricsWriter metrics(leader ? f.metrics_file : "");
  // TensorBoard scalars (rank 0). Optional output: a failure warns once and training goes on.
  std::unique_ptr<metrics::EventWriter> tensorboard;
  if (leader && !f.tensorboard_dir.empty()) {
    auto w = metrics::EventWriter::Open(f.tensorboard_dir);
    if (w.ok()) {
      tensorboard = std::move(*w);
    } else {
      fmt::print(stderr, "cohort-train: warning: --tensorboard-dir: {}; continuing without it\n",
                 w.status().ToString());
    }
  }
  auto tensorboard_write = [&](int64_t step,
                               std::initializer_list<std::pair<const char*, double>> scalars) {
    if (!tensorboard) return;
    Status st;
    for (const auto& [tag, value] : scalars) {
      if (st.ok()) st = tensorboard->AddScalar(tag, step, value);
    }
    if (st.ok()) st = tensorboard->Flush();
    if (!st.ok()) {
      fmt::print(stderr, "cohort-train: warning: --tensorboard-dir: {}; continuing without it\n",
                 st.ToString());
      tensorboard.reset();
    }
  };
  int64_t fault_rank = -1, fault_step = -1;
  if (launched.ok() && launched->restart_count == 0) {
    fault_rank = settings::kTrainFaultRank.Get();
    fault_step = settings::kTrainFaultStep.Get();
  }

  auto save = [&](const TrainState& st) {
    if (!checkpointer || !leader) return;
    Require(checkpointer->Save(st, *model, optimizer.get()), kExitInternal, "checkpoint");
  };

  // 7. Train.
  model->train();
  const auto t_start = SteadyClock::now();
  auto t_window = t_start;
  int64_t window_steps = 0;
  double window_wait = ddp.stats().comm_wait_seconds;
  const int64_t first_step = state.global_step;
  double loss_sum = 0;
  int64_t loss_count = 0;
  while (state.global_step < total_steps && state.epoch < f.epochs) {
    sampler.SetPosition(state.epoch, static_cast<size_t>(state.batch_in_epoch));
    PrefetchLoader loader(train_set, sampler.Batches(sampler.position()), state.epoch,
                          sampler.position());
    while (state.global_step < total_steps) {
      std::optional<Batch> batch = loader.Next();
      if (!batch) break;
      if (rank == fault_rank && state.global_step == fault_step) {
        fmt::print("rank {}: injecting SIGKILL at step {}\n", rank, state.global_step);
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      optimizer->zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch->x),
                                                                batch->y);
      loss.backward();
      Require(ddp.FinishGradientSync(), kExitComm, "gradient synchronisation");
      optimizer->step();
      ++state.global_step;
      state.batch_in_epoch = static_cast<int64_t>(batch->index) + 1;
      loss_sum += loss.item<double>();
      ++loss_count;
      ++window_steps;
      const bool epoch_end = state.batch_in_epoch >= per_epoch;
      if (epoch_end) {
        ++state.epoch;
        state.batch_in_epoch = 0;
      }
      if (f.checkpoint_every > 0 && state.global_step % f.checkpoint_every == 0) save(state);
      const bool log_now = (f.log_every > 0 && state.global_step % f.log_every == 0) ||
                           state.global_step == total_steps || epoch_end;
      if (log_now) {
        // Mean loss over the window and the ranks (every rank takes part).
        double l[2] = {loss_sum, static_cast<double>(loss_count)};
        if (comm) {
          Require(comm->AllReduce(l, l, 2, comm::DataType::kF64, comm::ReduceOp::kSum)
                      ->Wait(Deadline::AfterMs(300000)),
                  kExitComm, "loss allreduce");
        }
        loss_sum = 0;
        loss_count = 0;
        {
          // Every rank's own numbers, for the agent's /metrics and dashboard (exporter.h).
          auto& reg = metrics::DefaultRegistry();
          const double window = std::max(SecondsSince(t_window), 1e-9);
          reg.GetGauge("cohort_train_step", "Optimizer steps done").Set(double(state.global_step));
          reg.GetGauge("cohort_train_epoch", "Epochs done (fractional)")
              .Set(double(state.global_step) / double(std::max<int64_t>(per_epoch, 1)));
          reg.GetGauge("cohort_train_loss", "Mean training loss over the last window, all ranks")
              .Set(l[0] / std::max(l[1], 1.0));
          reg.GetGauge("cohort_train_samples_per_second", "Samples this rank trained per second")
              .Set(window_steps * double(f.batch_size) / window);
          reg.GetGauge("cohort_train_comm_wait_fraction",
                       "Share of the last window spent waiting for gradient allreduce")
              .Set((ddp.stats().comm_wait_seconds - window_wait) / window);
          reg.GetHistogram("cohort_train_step_seconds", "Time per optimizer step (window mean)",
                           metrics::SecondsBuckets())
              .Observe(window / std::max<int64_t>(window_steps, 1));
        }
        if (leader) {
          double now_window = SecondsSince(t_window);
          double elapsed = SecondsSince(t_start);
          double sps = window_steps * double(f.batch_size) * world / std::max(now_window, 1e-9);
          double wait = ddp.stats().comm_wait_seconds - window_wait;
          double per_step = elapsed / double(state.global_step - first_step);
          double eta = per_step * double(total_steps - state.global_step);
          int64_t shown_epoch = epoch_end ? state.epoch : state.epoch + 1;
          int64_t shown_batch = epoch_end ? per_epoch : state.batch_in_epoch;
          fmt::print("epoch {}/{} step {}/{} (batch {}/{}) loss {:.4f} samples/s {:.0f} "
                     "comm_wait {:.1f}% eta {}\n",
                     shown_epoch, f.epochs, state.global_step, total_steps, shown_batch,
                     per_epoch, l[0] / std::max(l[1], 1.0), sps,
                     100.0 * wait / std::max(now_window, 1e-9), Hms(eta));
          std::fflush(stdout);
          metrics.Write({{"event", "step"},
                         {"step", state.global_step},
                         {"epoch", shown_epoch},
                         {"loss", l[0] / std::max(l[1], 1.0)},
                         {"samples_per_s", sps},
                         {"comm_wait_s", wait},
                         {"window_s", now_window},
                         {"elapsed_s", elapsed},
                         {"world_size", world}});
          tensorboard_write(state.global_step,
                            {{"train/loss", l[0] / std::max(l[1], 1.0)},
                             {"train/samples_per_s", sps},
                             {"train/comm_wait_fraction", wait / std::max(now_window, 1e-9)},
                             {"train/epoch", static_cast<double>(state.epoch) +
                                                 double(state.batch_in_epoch) / per_epoch}});
        }
        t_window = SteadyClock::now();
        window_steps = 0;
        window_wait = ddp.stats().comm_wait_seconds;
      }
      if (epoch_end) break;
    }
  }
  const double train_seconds = SecondsSince(t_start);
  // The final state, unless the last periodic checkpoint already holds it (0: end only).
  if (f.checkpoint_every <= 0 || state.global_step % f.checkpoint_every != 0) save(state);

  // 8. Test accuracy (rank 0's buffers, split across ranks).
  Require(ddp.SyncBuffers(), kExitComm, "buffer broadcast");
  auto [correct, total] = Evaluate(*model, test_set, comm.get(), rank, world);
  double accuracy = total > 0 ? double(correct) / double(total) : 0.0;
  // Every rank's own parameters: equal digests show the ranks trained as one job.
  const std::string digest = ParamDigest(*model);
  fmt::print("rank {} param_digest {}\n", rank, digest);
  std::fflush(stdout);
  if (leader) {
    int64_t steps_run = state.global_step - first_step;
    fmt::print("done: {} steps in {} ({:.0f} samples/s, comm wait {:.1f}%)\n", steps_run,
               Hms(train_seconds),
               steps_run * double(f.batch_size) * world / std::max(train_seconds, 1e-9),
               100.0 * ddp.stats().comm_wait_seconds / std::max(train_seconds, 1e-9));
    fmt::print("test_accuracy {:.4f} ({}/{})\n", accuracy, correct, total);
    fmt::print("param_digest {}\n", digest);
    std::fflush(stdout);
    metrics.Write({{"event", "end"},
                   {"step", state.global_step},
                   {"test_accuracy", accuracy},
                   {"train_s", train_seconds},
                   {"comm_wait_s", ddp.stats().comm_wait_seconds},
                   {"param_digest", digest}});
    tensorboard_write(state.global_step, {{"test/accuracy", accuracy}});
    tensorboard.reset();  // flushes and closes
  }
  if (comm) {
    // Nobody leaves (closing connections) while a peer still evaluates.
    Require(comm->Barrier()->Wait(Deadline::AfterMs(300000)), kExitComm, "final barrier");
  }
  return kExitOk;
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
                 "checkpoint directory; the newest valid checkpoint is resumed");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "checkpoint every N steps and at the end (0: only at the end); needs "
                 "--checkpoint-dir")
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
