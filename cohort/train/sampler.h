// DistributedSampler: which dataset indices each rank reads, in which batches, per epoch.
//
// 1. A permutation of [0, n) is drawn from (seed, epoch) with cohort's own generator
//    (splitmix64 + Fisher-Yates), so it never depends on torch's global RNG and is the
//    same on every rank and in every process (resume).
// 2. The permutation is cut to a multiple of the world size: padded by repeating its first
//    indices (kPad, every sample is seen) or truncated (kDrop).
// 3. Rank r takes positions r, r+W, r+2W, ... (kStride: batch k of W ranks with batch B is
//    exactly batch k of one process with batch W*B) or one contiguous block (kContiguous).
// 4. The rank's indices are cut into batches of B; the last partial batch is kept unless
//    drop_last_batch.
// The sampler's position (epoch, batch) is what a checkpoint stores; SetPosition resumes
// mid-epoch.
//
// Thread-safety: none; one owner (the loader reads a copy of an epoch's batches).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace cohort::train {

enum class Partition { kStride, kContiguous };
enum class Remainder { kPad, kDrop };

struct SamplerOptions {
  uint64_t seed = 0;
  bool shuffle = true;
  Partition partition = Partition::kStride;
  Remainder remainder = Remainder::kPad;
  bool drop_last_batch = false;
};

class DistributedSampler {
 public:
  DistributedSampler(size_t dataset_size, int rank, int world_size, size_t batch_size,
                     SamplerOptions options = {});

  // A deterministic permutation of [0, n) from (seed, epoch).
  static std::vector<size_t> Permutation(size_t n, uint64_t seed, int64_t epoch);

  int64_t epoch() const { return epoch_; }
  // Batches consumed in the current epoch (the next batch's index).
  size_t position() const { return position_; }
  // Samples this rank reads per epoch.
  size_t samples_per_rank() const { return per_rank_; }
  size_t batches_per_epoch() const;
  size_t batch_size() const { return batch_size_; }
  const SamplerOptions& options() const { return options_; }

  // Starts `epoch` at batch 0.
  void SetEpoch(int64_t epoch) { SetPosition(epoch, 0); }
  // Resume point: the next NextBatch() returns batch `batch` of `epoch`.
  void SetPosition(int64_t epoch, size_t batch);
  // The next batch of this epoch, or nullopt at its end.
  std::optional<std::vector<size_t>> NextBatch();

  // This rank's indices for the current epoch, in order.
  std::vector<size_t> RankIndices() const;
  // All batches of the current epoch from `from` on.
  std::vector<std::vector<size_t>> Batches(size_t from = 0) const;

 private:
  void Build();

  size_t n_;
  int rank_, world_;
  size_t batch_size_;
  SamplerOptions options_;
  size_t per_rank_ = 0;
  int64_t epoch_ = 0;
  size_t position_ = 0;
  std::vector<size_t> indices_;  // this rank's, current epoch
};

}  // namespace cohort::train
