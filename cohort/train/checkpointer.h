// Checkpointer: saves and restores a training run (model parameters and buffers, optimizer
// state, sampler position, epoch/step, torch's default generator state and the sampler
// seed) as checkpoint files (checkpoint_file.h: atomic, checksummed, newest K usable kept).
//
// Loading walks the checkpoints from newest to oldest: one that is truncated, corrupt or
// unreadable is skipped with a warning and the previous one is tried. The newest readable
// checkpoint must belong to this model (same model name, same parameter and buffer names,
// dtypes and shapes) and optimizer; otherwise LoadLatest fails with kFailedPrecondition and
// restores nothing. No checkpoint at all is kNotFound (start fresh); checkpoints of which
// none is readable is kDataLoss (the run's progress must not silently restart at step 0).
//
// Thread-safety: not thread-safe; one owner. Only one process (rank 0) should Save into a
// directory.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "cohort/base/status.h"
#include "cohort/train/checkpoint_file.h"

namespace cohort::train {

// Where training stands at a step boundary.
struct TrainState {
  int64_t global_step = 0;     // optimizer steps done
  int64_t epoch = 0;           // epoch of the next batch
  int64_t batch_in_epoch = 0;  // index of the next batch within `epoch`
  uint64_t seed = 0;           // sampler/model seed of the run
  int world_size = 1;
  int64_t batch_size = 0;      // per rank
};

// "name:dtype[d0,d1,...]" for every parameter and buffer, ';'-separated.
std::string ModelSignature(torch::nn::Module& model);

// The training state (model parameters and buffers, optimizer state, position, torch's
// generator) as a checkpoint's bytes, and back: what a Checkpointer keeps in files, and what
// a running job sends a newcomer (live reconfiguration). `model_name` and `optimizer_name`
// ("sgd", "adam") are recorded and checked on decoding.
class StateCodec {
 public:
  StateCodec(std::string model_name, std::string optimizer_name)
      : model_name_(std::move(model_name)), optimizer_name_(std::move(optimizer_name)) {}

  Result<CheckpointBlob> Encode(const TrainState& state, torch::nn::Module& model,
                                torch::optim::Optimizer* optimizer) const;
  // Restores `blob` (named `what` in errors) into the model and optimizer, or leaves them
  // untouched on an error. kFailedPrecondition (and *wrong_model) when the blob is from
  // another model or optimizer; kDataLoss when it cannot be read.
  Result<TrainState> Decode(CheckpointBlob blob, const std::string& what,
                            torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                            bool* wrong_model = nullptr) const;

 private:
  std::string model_name_, optimizer_name_;
};

class Checkpointer {
 public:
  // `model_name` and `optimizer_name` ("sgd", "adam") are recorded and checked on load.
  Checkpointer(std::string dir, std::string model_name, std::string optimizer_name, int keep);

  const std::string& dir() const { return dir_.dir(); }
  Status Save(const TrainState& state, torch::nn::Module& model,
              torch::optim::Optimizer* optimizer);
  // NotFound when no checkpoint is usable (none, or all corrupt: each is warned about);
  // FailedPrecondition for another model or optimizer.
  Result<TrainState> LoadLatest(torch::nn::Module& model, torch::optim::Optimizer* optimizer);
  // The step of the checkpoint LoadLatest restored, for logs.
  const std::string& loaded_path() const { return loaded_path_; }

 private:
  Result<TrainState> LoadFile(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer* optimizer, bool* wrong_model);

  CheckpointDir dir_;
  StateCodec codec_;
  int keep_;
  std::string loaded_path_;
};

}  // namespace cohort::train
