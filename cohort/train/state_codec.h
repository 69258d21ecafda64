// The training state of a run (model parameters and buffers, optimizer state, sampler
// position, epoch/step, torch's default generator state and the sampler seed) and its
// encoding, StateCodec: the bytes of snapshots and checkpoint files (snapshot_store.h,
// checkpoint_file.h) and of the state a running job sends a newcomer. Decoding checks that
// the state belongs to this model (same model name, same parameter and buffer names, dtypes
// and shapes) and optimizer: otherwise kFailedPrecondition, and nothing is restored.
//
// Thread-safety: StateCodec is immutable; Encode/Decode touch the given model and optimizer,
// which the caller owns (one thread).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/train/checkpoint_file.h"
#include "cohort/train/snapshot_store.h"

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
// generator) as a checkpoint's bytes, and back: what checkpoint files keep, what a
// snapshot holds, and what a running job sends a newcomer (live reconfiguration).
// `model_name` and `optimizer_name` ("sgd", "adam") are recorded and checked on decoding.
//
// The payload is the tensors' raw bytes, each at a 64-byte aligned offset, listed in the
// metadata ("format": "raw1", "tensors": [[name, dtype, shape, offset, bytes], ...]):
// encoding is one memcpy per tensor. Files of the earlier format (a torch archive) are
// still read.
class StateCodec {
 public:
  StateCodec(std::string model_name, std::string optimizer_name)
      : model_name_(std::move(model_name)), optimizer_name_(std::move(optimizer_name)) {}

  // One encoding of the state: its metadata, the payload's size, and Fill, which copies
  // the tensors (the model's and optimizer's own, not copies: fill before they change)
  // into `payload` and returns the CRC-32 continued from `crc` over it.
  struct Plan {
    std::string meta;
    size_t payload_size = 0;
    std::vector<torch::Tensor> tensors;  // kept alive for `pieces`
    std::vector<PayloadPiece> pieces;
    uint32_t Fill(char* payload, uint32_t crc) const;
  };
  Result<Plan> PlanEncoding(const TrainState& state, torch::nn::Module& model,
                            torch::optim::Optimizer* optimizer) const;

  Result<CheckpointBlob> Encode(const TrainState& state, torch::nn::Module& model,
                                torch::optim::Optimizer* optimizer) const;
  // Restores `blob` (named `what` in errors) into the model and optimizer, or leaves them
  // untouched on an error. kFailedPrecondition (and *wrong_model) when the blob is from
  // another model or optimizer; kDataLoss when it cannot be read.
  Result<TrainState> Decode(CheckpointBlob blob, const std::string& what,
                            torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                            bool* wrong_model = nullptr) const;
  Result<TrainState> Decode(CheckpointView view, const std::string& what,
                            torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                            bool* wrong_model = nullptr) const;

 private:
  Status DecodeRaw(const nlohmann::json& meta, std::string_view payload, const std::string& what,
                   torch::nn::Module& model, torch::optim::Optimizer* optimizer) const;
  Status DecodeArchive(std::string_view payload, const std::string& what,
                       torch::nn::Module& model, torch::optim::Optimizer* optimizer) const;

  std::string model_name_, optimizer_name_;
};

}  // namespace cohort::train
