// Trainer: one data-parallel training run of cohort-train, in the order Run() calls its
// steps: build the model, resume (the newest snapshot or checkpoint of any rank, or the state
// the running ranks hold), train, evaluate. The protocol, the output lines and the exit
// codes are described at the top of cohort_train_main.cc, which parses the flags, loads the
// data, joins the job (Membership) and hands them to a Trainer.
//
// Also here: Flags (cohort-train's command line), Exit (an error that ends the program with
// its exit code; every step throws it, main catches it) and Require.
//
// Thread-safety: a Trainer is used by one thread (the program's main thread). It starts a
// loader thread per epoch (PrefetchLoader, data.h) and its SnapshotStore's persister thread
// (snapshot_store.h); both keep their own locks and the Trainer only calls their methods.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/base/worker_env.h"
#include "cohort/comm/communicator.h"
#include "cohort/comm/live_membership.h"
#include "cohort/train/data.h"
#include "cohort/train/ddp.h"
#include "cohort/train/models.h"
#include "cohort/train/sampler.h"
#include "cohort/train/snapshot_store.h"
#include "cohort/train/state_codec.h"

namespace cohort::train {

// cohort-train's flags (main() in cohort_train_main.cc documents each).
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

// Ends the program: main prints the message and exits with the code (base/exit_codes.h).
class Exit : public std::exception {
 public:
  Exit(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code() const { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  int code_;
  std::string message_;
};

// Throws Exit(code, "what: status") when `st` is not ok.
void Require(const Status& st, int code, std::string_view what);

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

class Reporter;  // train_report.h

// One training run, in the order Run() calls its steps: join the job, build the model,
// resume, train, evaluate.
class Trainer {
 public:
  Trainer(const Flags& f, Dataset train_set, Dataset test_set, Membership job);
  ~Trainer();

  // Trains and evaluates; kExitOk, or throws Exit.
  int Run();

 private:
  void Resume();
  void MakeDdp();
  void Repartitioned();
  double CommWait() const;
  bool ShareState(bool has_state, bool from_checkpoint = false);
  void Reconfigure(Status why);
  void Announce() const;
  void Train();
  Result<bool> Step(const Batch& batch);
  Status Report(bool epoch_end);
  void MakeSnapshotStore();
  void Snapshot();
  void Finish();

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

}  // namespace cohort::train
