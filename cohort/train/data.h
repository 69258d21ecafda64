// Data sets as tensors and a background-prefetching batch loader.
//
// A Dataset keeps images as uint8 [N, C, H, W] and labels as int64 [N]; batches are
// converted to normalised float on the loader thread. Names: "fashion-mnist", "mnist"
// (idx files, gzip or not), "cifar10" (binary batches), "synthetic" (seeded, learnable:
// class prototypes plus noise, 1x28x28).
//
// PrefetchLoader runs one thread ("train-loader") that builds the batches of one epoch in
// order into a bounded queue. Shutdown sets a stop flag and wakes the thread; it never
// blocks on anything but the queue, so the destructor returns promptly.
//
// Thread-safety: a Dataset is immutable after loading and may be read from any thread. A
// PrefetchLoader is used by one consumer thread; its mu_ guards the queue and the stop/done
// flags it shares with the loader thread.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cohort/base/mutex.h"
#include "cohort/base/status.h"
#include "cohort/train/models.h"

namespace cohort::train {

struct Dataset {
  std::string name;
  torch::Tensor images;  // uint8 [N, C, H, W]
  torch::Tensor labels;  // int64 [N]
  std::vector<float> mean, stddev;  // per channel, on the 0..1 scale
  int num_classes = 10;

  size_t size() const { return images.defined() ? static_cast<size_t>(images.size(0)) : 0; }
  InputShape shape() const;
  // Normalised float images for `indices` ([B, C, H, W]) and their labels ([B]).
  std::pair<torch::Tensor, torch::Tensor> Gather(const std::vector<size_t>& indices) const;
};

const std::vector<std::string>& DatasetNames();
// `train` picks the training or the test split. InvalidArgument for an unknown name,
// NotFound for a missing directory or file, DataLoss for a malformed file.
Result<Dataset> LoadDataset(const std::string& name, const std::string& dir, bool train,
                            uint64_t seed = 0);

struct Batch {
  int64_t epoch = 0;
  size_t index = 0;  // batch index within the epoch
  torch::Tensor x, y;
};

class PrefetchLoader {
 public:
  // Produces batches[i] for i = 0.. as Batch{epoch, first_index + i}. `dataset` must
  // outlive the loader.
  PrefetchLoader(const Dataset& dataset, std::vector<std::vector<size_t>> batches,
                 int64_t epoch, size_t first_index, size_t depth = 4);
  ~PrefetchLoader();
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // The next batch, or nullopt after the last one.
  std::optional<Batch> Next() COHORT_EXCLUDES(mu_);

 private:
  void Run() COHORT_EXCLUDES(mu_);

  const Dataset& dataset_;
  const std::vector<std::vector<size_t>> batches_;
  const int64_t epoch_;
  const size_t first_index_;
  const size_t depth_;
  Mutex mu_;
  CondVar changed_;  // signalled on every push, pop, stop and done
  std::deque<Batch> queue_ COHORT_GUARDED_BY(mu_);
  bool stop_ COHORT_GUARDED_BY(mu_) = false;
  bool done_ COHORT_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cohort::train
