// Data sets and the prefetching loader (see data.h). Thread-safety: see data.h (mu_ guards
// the loader's queue_, stop_ and done_).
#include "cohort/train/data.h"

#include <pthread.h>

#include <cstring>
#include <random>

#include "cohort/train/data_files.h"

namespace cohort::train {
namespace {

Dataset FromImageSet(std::string name, ImageSet&& set, std::vector<float> mean,
                     std::vector<float> stddev) {
  Dataset ds;
  ds.name = std::move(name);
  auto n = static_cast<int64_t>(set.n);
  ds.images = torch::empty({n, set.channels, set.height, set.width}, torch::kUInt8);
  std::memcpy(ds.images.data_ptr(), set.pixels.data(), set.pixels.size());
  ds.labels = torch::empty({n}, torch::kInt64);
  std::memcpy(ds.labels.data_ptr(), set.labels.data(), set.labels.size() * sizeof(int64_t));
  ds.mean = std::move(mean);
  ds.stddev = std::move(stddev);
  ds.num_classes = set.num_classes;
  return ds;
}

// Ten class prototypes (smooth blobs at seeded positions) plus per-sample noise; the same
// prototypes for both splits, different samples. Uses std::mt19937_64 bits only (no
// distribution objects) so the data are the same with every standard library.
Dataset Synthetic(bool train, uint64_t seed) {
  constexpr int kH = 28, kW = 28, kClasses = 10;
  const int64_t n = train ? 8192 : 2048;
  std::mt19937_64 proto_rng(seed * 7919 + 17);
  std::vector<float> protos(kClasses * kH * kW);
  for (int c = 0; c < kClasses; ++c) {
    for (int blob = 0; blob < 3; ++blob) {
      double cy = 4 + proto_rng() % 20, cx = 4 + proto_rng() % 20;
      for (int y = 0; y < kH; ++y) {
        for (int x = 0; x < kW; ++x) {
          double d2 = (y - cy) * (y - cy) + (x - cx) * (x - cx);
          protos[(c * kH + y) * kW + x] += static_cast<float>(std::exp(-d2 / 18.0));
        }
      }
    }
  }
  std::mt19937_64 rng(seed * 104729 + (train ? 1 : 2));
  ImageSet set;
  set.n = static_cast<size_t>(n);
  set.channels = 1;
  set.height = kH;
  set.width = kW;
  set.pixels.resize(set.n * kH * kW);
  for (size_t i = 0; i < set.n; ++i) {
    int label = static_cast<int>(rng() % kClasses);
    set.labels.push_back(label);
    for (int p = 0; p < kH * kW; ++p) {
      double noise = static_cast<double>(rng() >> 11) / 9007199254740992.0 - 0.5;  // [-0.5, .5)
      double v = 0.15 + 0.6 * protos[label * kH * kW + p] + 0.5 * noise;
      set.pixels[i * kH * kW + p] = static_cast<uint8_t>(std::clamp(v, 0.0, 1.0) * 255.0);
    }
  }
  return FromImageSet("synthetic", std::move(set), {0.25f}, {0.25f});
}

}  // namespace

InputShape Dataset::shape() const {
  return InputShape{static_cast<int>(images.size(1)), static_cast<int>(images.size(2)),
                    static_cast<int>(images.size(3)), num_classes};
}

std::pair<torch::Tensor, torch::Tensor> Dataset::Gather(const std::vector<size_t>& indices) const {
  torch::NoGradGuard no_grad;
  auto idx = torch::empty({static_cast<int64_t>(indices.size())}, torch::kInt64);
  auto* p = idx.data_ptr<int64_t>();
  for (size_t i = 0; i < indices.size(); ++i) p[i] = static_cast<int64_t>(indices[i]);
  torch::Tensor x = images.index_select(0, idx).to(torch::kFloat32).div_(255.0f);
  const int64_t c = images.size(1);
  auto m = torch::from_blob(const_cast<float*>(mean.data()), {1, c, 1, 1}, torch::kFloat32);
  auto s = torch::from_blob(const_cast<float*>(stddev.data()), {1, c, 1, 1}, torch::kFloat32);
  x.sub_(m).div_(s);
  return {x, labels.index_select(0, idx)};
}

const std::vector<std::string>& DatasetNames() {
  static const std::vector<std::string> kNames = {"fashion-mnist", "mnist", "cifar10",
                                                  "synthetic"};
  return kNames;
}

Result<Dataset> LoadDataset(const std::string& name, const std::string& dir, bool train,
                            uint64_t seed) {
  if (name == "fashion-mnist" || name == "mnist") {
    COHORT_ASSIGN_OR_RETURN(ImageSet set, ReadMnist(dir, train ? "train" : "t10k"));
    if (name == "mnist") return FromImageSet(name, std::move(set), {0.1307f}, {0.3081f});
    return FromImageSet(name, std::move(set), {0.2860f}, {0.3530f});
  }
  if (name == "cifar10") {
    COHORT_ASSIGN_OR_RETURN(ImageSet set, ReadCifar10(dir, train));
    return FromImageSet(name, std::move(set), {0.4914f, 0.4822f, 0.4465f},
                        {0.2470f, 0.2435f, 0.2616f});
  }
  if (name == "synthetic") return Synthetic(train, seed);
  return InvalidArgument("unknown dataset '{}' (choose one of: fashion-mnist, mnist, cifar10, "
                         "synthetic)", name);
}

PrefetchLoader::PrefetchLoader(const Dataset& dataset, std::vector<std::vector<size_t>> batches,
                               int64_t epoch, size_t first_index, size_t depth)
    : dataset_(dataset), batches_(std::move(batches)), epoch_(epoch),
      first_index_(first_index), depth_(std::max<size_t>(depth, 1)) {
  thread_ = std::thread([this] { Run(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  changed_.SignalAll();
  thread_.join();
}

void PrefetchLoader::Run() {
  pthread_setname_np(pthread_self(), "train-loader");
  for (size_t i = 0; i < batches_.size(); ++i) {
    {
      MutexLock lock(&mu_);
      while (!stop_ && queue_.size() >= depth_) changed_.Wait(&mu_);
      if (stop_) break;
    }
    auto [x, y] = dataset_.Gather(batches_[i]);
    {
      MutexLock lock(&mu_);
      queue_.push_back(Batch{epoch_, first_index_ + i, std::move(x), std::move(y)});
    }
    changed_.SignalAll();
  }
  {
    MutexLock lock(&mu_);
    done_ = true;
  }
  changed_.SignalAll();
}

std::optional<Batch> PrefetchLoader::Next() {
  std::optional<Batch> b;
  {
    MutexLock lock(&mu_);
    while (queue_.empty() && !done_) changed_.Wait(&mu_);
    if (queue_.empty()) return std::nullopt;
    b = std::move(queue_.front());
    queue_.pop_front();
  }
  changed_.SignalAll();  // a slot is free: the loader may refill it
  return b;
}

}  // namespace cohort::train
