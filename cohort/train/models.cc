// Model definitions (see models.h). Thread-safety: as torch::nn::Module.
#include "cohort/train/models.h"

namespace cohort::train {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

class Mlp : public Classifier {
 public:
  explicit Mlp(const InputShape& s) {
    int in = s.channels * s.height * s.width;
    fc1_ = register_module("fc1", nn::Linear(in, 512));
    fc2_ = register_module("fc2", nn::Linear(512, 256));
    fc3_ = register_module("fc3", nn::Linear(256, s.num_classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = x.flatten(1);
    x = torch::relu(fc1_->forward(x));
    x = torch::relu(fc2_->forward(x));
    return fc3_->forward(x);
  }

 private:
  nn::Linear fc1_{nullptr}, fc2_{nullptr}, fc3_{nullptr};
};

// The CIFAR-10 tutorial network: conv(5x5) -> pool -> conv(5x5) -> pool -> 3 linear layers.
// For 3x32x32 input it is the classic 6/16 channels; for 1-channel 28x28 input the channels
// are widened to 16/32 (still ~2.6e5 parameters), which reaches ~90% on Fashion-MNIST in a
// few epochs.
class Cnn : public Classifier {
 public:
  explicit Cnn(const InputShape& s) {
    int c1 = s.channels == 1 ? 16 : 6;
    int c2 = s.channels == 1 ? 32 : 16;
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(s.channels, c1, 5)));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(c1, c2, 5)));
    int h = ((s.height - 4) / 2 - 4) / 2, w = ((s.width - 4) / 2 - 4) / 2;
    flat_ = c2 * h * w;
    fc1_ = register_module("fc1", nn::Linear(flat_, 120));
    fc2_ = register_module("fc2", nn::Linear(120, 84));
    fc3_ = register_module("fc3", nn::Linear(84, s.num_classes));
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = F::max_pool2d(torch::relu(conv1_->forward(x)), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(torch::relu(conv2_->forward(x)), F::MaxPool2dFuncOptions(2));
    x = x.flatten(1);
    x = torch::relu(fc1_->forward(x));
    x = torch::relu(fc2_->forward(x));
    return fc3_->forward(x);
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::Linear fc1_{nullptr}, fc2_{nullptr}, fc3_{nullptr};
  int flat_ = 0;
};

nn::Conv2d Conv3x3(int in, int out, int stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}
nn::Conv2d Conv1x1(int in, int out, int stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

class BlockBase : public nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

// The projection on a residual block's shortcut when the block changes the shape (a 1x1
// convolution and batch norm); none when the input can be added as it is.
nn::Sequential Shortcut(int in, int out, int stride) {
  if (stride == 1 && in == out) return nn::Sequential(nullptr);
  return nn::Sequential(Conv1x1(in, out, stride), nn::BatchNorm2d(out));
}

class BasicBlock : public BlockBase {
 public:
  static constexpr int kExpansion = 1;
  BasicBlock(int in, int planes, int stride) {
    conv1_ = register_module("conv1", Conv3x3(in, planes, stride));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", Conv3x3(planes, planes, 1));
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    if (auto shortcut = Shortcut(in, planes * kExpansion, stride)) {
      downsample_ = register_module("downsample", shortcut);
    }
  }
  torch::Tensor forward(torch::Tensor x) override {
    torch::Tensor identity = downsample_ ? downsample_->forward(x) : x;
    torch::Tensor out = torch::relu(bn1_->forward(conv1_->forward(x)));
    out = bn2_->forward(conv2_->forward(out));
    return torch::relu(out + identity);
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  nn::Sequential downsample_{nullptr};
};

class Bottleneck : public BlockBase {
 public:
  static constexpr int kExpansion = 4;
  Bottleneck(int in, int planes, int stride) {
    conv1_ = register_module("conv1", Conv1x1(in, planes, 1));
    bn1_ = register_module("bn1", nn::BatchNorm2d(planes));
    conv2_ = register_module("conv2", Conv3x3(planes, planes, stride));  // stride here (v1.5)
    bn2_ = register_module("bn2", nn::BatchNorm2d(planes));
    conv3_ = register_module("conv3", Conv1x1(planes, planes * kExpansion, 1));
    bn3_ = register_module("bn3", nn::BatchNorm2d(planes * kExpansion));
    if (auto shortcut = Shortcut(in, planes * kExpansion, stride)) {
      downsample_ = register_module("downsample", shortcut);
    }
  }
  torch::Tensor forward(torch::Tensor x) override {
    torch::Tensor identity = downsample_ ? downsample_->forward(x) : x;
    torch::Tensor out = torch::relu(bn1_->forward(conv1_->forward(x)));
    out = torch::relu(bn2_->forward(conv2_->forward(out)));
    out = bn3_->forward(conv3_->forward(out));
    return torch::relu(out + identity);
  }

 private:
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  nn::Sequential downsample_{nullptr};
};

// A stage of blocks, registered as "0", "1", ... like torchvision's nn.Sequential.
class Stage : public nn::Module {
 public:
  void Add(std::shared_ptr<BlockBase> block) {
    blocks_.push_back(register_module(std::to_string(blocks_.size()), block));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks_) x = b->forward(x);
    return x;
  }

 private:
  std::vector<std::shared_ptr<BlockBase>> blocks_;
};

template <typename Block>
class ResNet : public Classifier {
 public:
  ResNet(const InputShape& s, std::array<int, 4> layers) {
    conv1_ = register_module(
        "conv1", nn::Conv2d(nn::Conv2dOptions(s.channels, 64, 7).stride(2).padding(3).bias(false)));
    bn1_ = register_module("bn1", nn::BatchNorm2d(64));
    const int widths[4] = {64, 128, 256, 512};
    for (int i = 0; i < 4; ++i) {
      auto stage = std::make_shared<Stage>();
      for (int j = 0; j < layers[i]; ++j) {
        int stride = (i > 0 && j == 0) ? 2 : 1;
        stage->Add(std::make_shared<Block>(inplanes_, widths[i], stride));
        inplanes_ = widths[i] * Block::kExpansion;
      }
      stages_[i] = register_module("layer" + std::to_string(i + 1), stage);
    }
    fc_ = register_module("fc", nn::Linear(512 * Block::kExpansion, s.num_classes));
    // torchvision's initialisation: Kaiming normal (fan_out, relu) for convolutions,
    // BatchNorm weight 1 and bias 0.
    torch::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<nn::Conv2d>()) {
        nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    }
  }
  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(bn1_->forward(conv1_->forward(x)));
    x = F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1));
    for (auto& st : stages_) x = st->forward(x);
    x = F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions({1, 1})).flatten(1);
    return fc_->forward(x);
  }

 private:
  int inplanes_ = 64;
  nn::Conv2d conv1_{nullptr};
  nn::BatchNorm2d bn1_{nullptr};
  std::array<std::shared_ptr<Stage>, 4> stages_;
  nn::Linear fc_{nullptr};
};

}  // namespace

const std::vector<std::string>& ModelNames() {
  static const std::vector<std::string> kNames = {"mlp", "cnn", "resnet18", "resnet50"};
  return kNames;
}

Result<std::shared_ptr<Classifier>> MakeModel(const std::string& name, const InputShape& shape) {
  if (name == "mlp") return std::shared_ptr<Classifier>(std::make_shared<Mlp>(shape));
  if (name == "cnn") {
    if (shape.height < 16 || shape.width < 16) {
      return InvalidArgument("cnn needs inputs of at least 16x16, not {}x{}", shape.height,
                             shape.width);
    }
    return std::shared_ptr<Classifier>(std::make_shared<Cnn>(shape));
  }
  if (name == "resnet18") {
    return std::shared_ptr<Classifier>(
        std::make_shared<ResNet<BasicBlock>>(shape, std::array<int, 4>{2, 2, 2, 2}));
  }
  if (name == "resnet50") {
    return std::shared_ptr<Classifier>(
        std::make_shared<ResNet<Bottleneck>>(shape, std::array<int, 4>{3, 4, 6, 3}));
  }
  return InvalidArgument("unknown model '{}' (choose one of: mlp, cnn, resnet18, resnet50)", name);
}

}  // namespace cohort::train
