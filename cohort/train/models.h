// Image classifiers for the trainer: MLP, the small CIFAR-style CNN (two conv + three
// linear layers), and ResNet-18/50 with torchvision's architecture (BasicBlock/Bottleneck,
// widths 64-128-256-512, 7x7 stride-2 stem + max pool, global average pool, fc).
//
// Parameter names follow torchvision (conv1.weight, layer1.0.bn1.running_mean, fc.bias, ...).
// Thread-safety: as torch::nn::Module (no concurrent forward/backward on one instance).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::train {

struct InputShape {
  int channels = 1, height = 28, width = 28;
  int num_classes = 10;
};

class Classifier : public torch::nn::Module {
 public:
  // [N, C, H, W] float -> logits [N, num_classes].
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// The model names MakeModel accepts, in the order of the --model help.
const std::vector<std::string>& ModelNames();
// InvalidArgument for an unknown name. Initialisation uses torch's default generator:
// seed it (torch::manual_seed) first for reproducible weights.
Result<std::shared_ptr<Classifier>> MakeModel(const std::string& name, const InputShape& shape);

}  // namespace cohort::train
