// DistributedSampler (see sampler.h). Thread-safety: none.
#include "cohort/train/sampler.h"

#include <algorithm>
#include <numeric>

#include "cohort/base/check.h"

namespace cohort::train {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection sampling).
uint64_t Below(uint64_t& state, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = SplitMix64(state);
  } while (x >= limit);
  return x % bound;
}

}  // namespace

DistributedSampler::DistributedSampler(size_t dataset_size, int rank, int world_size,
                                       size_t batch_size, SamplerOptions options)
    : n_(dataset_size), rank_(rank), world_(world_size), batch_size_(batch_size),
      options_(options) {
  COHORT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size) << rank << "/" << world_size;
  COHORT_CHECK(batch_size >= 1) << "batch size 0";
  if (options_.remainder == Remainder::kPad) {
    per_rank_ = (n_ + world_ - 1) / world_;
  } else {
    per_rank_ = n_ / world_;
  }
  Build();
}

std::vector<size_t> DistributedSampler::Permutation(size_t n, uint64_t seed, int64_t epoch) {
  std::vector<size_t> p(n);
  std::iota(p.begin(), p.end(), size_t{0});
  uint64_t state = seed * 0x2545f4914f6cdd1dull ^ (static_cast<uint64_t>(epoch) + 0x632be59bd9b4e019ull);
  SplitMix64(state);
  for (size_t i = n; i > 1; --i) {
    size_t j = static_cast<size_t>(Below(state, i));
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

size_t DistributedSampler::batches_per_epoch() const {
  if (options_.drop_last_batch) return per_rank_ / batch_size_;
  return (per_rank_ + batch_size_ - 1) / batch_size_;
}

void DistributedSampler::SetPosition(int64_t epoch, size_t batch) {
  COHORT_CHECK(batch <= batches_per_epoch()) << batch << " > " << batches_per_epoch();
  if (epoch != epoch_ || indices_.empty()) {
    epoch_ = epoch;
    Build();
  }
  position_ = batch;
}

void DistributedSampler::Build() {
  std::vector<size_t> all;
  if (options_.shuffle) {
    all = Permutation(n_, options_.seed, epoch_);
  } else {
    all.resize(n_);
    std::iota(all.begin(), all.end(), size_t{0});
  }
  const size_t total = per_rank_ * world_;
  // Pad by repeating from the start (possibly more than once for tiny data sets).
  for (size_t i = 0; all.size() < total && n_ > 0; ++i) all.push_back(all[i % n_]);
  all.resize(total);
  indices_.clear();
  indices_.reserve(per_rank_);
  for (size_t k = 0; k < per_rank_; ++k) {
    size_t pos = options_.partition == Partition::kStride ? k * world_ + rank_
                                                          : rank_ * per_rank_ + k;
    indices_.push_back(all[pos]);
  }
}

std::optional<std::vector<size_t>> DistributedSampler::NextBatch() {
  if (position_ >= batches_per_epoch()) return std::nullopt;
  size_t begin = position_ * batch_size_;
  size_t end = std::min(begin + batch_size_, per_rank_);
  ++position_;
  return std::vector<size_t>(indices_.begin() + begin, indices_.begin() + end);
}

std::vector<size_t> DistributedSampler::RankIndices() const { return indices_; }

std::vector<std::vector<size_t>> DistributedSampler::Batches(size_t from) const {
  std::vector<std::vector<size_t>> out;
  for (size_t b = from; b < batches_per_epoch(); ++b) {
    size_t begin = b * batch_size_;
    size_t end = std::min(begin + batch_size_, per_rank_);
    out.emplace_back(indices_.begin() + begin, indices_.begin() + end);
  }
  return out;
}

}  // namespace cohort::train
