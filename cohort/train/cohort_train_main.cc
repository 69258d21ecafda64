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
// This file: the flags, their checks, loading the data and joining the job (JoinJob); the
// training run itself is a Trainer (trainer.h), its progress output a Reporter
// (train_report.h).
//
// Thread-safety: a program; the main thread trains, one loader thread prefetches batches.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cohort/base/exit_codes.h"
#include "cohort/base/worker_env.h"
#include "cohort/comm/communicator.h"
#include "cohort/comm/live_membership.h"
#include "cohort/metrics/exporter.h"
#include "cohort/train/data.h"
#include "cohort/train/models.h"
#include "cohort/train/trainer.h"

namespace cohort::train {
namespace {

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string Join(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, ", "));
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

// Joins the job's communicator (exit code 10 when it cannot) and its membership channel
// when the agent offers one; prints `rank R of W: transport T, round N`.
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
