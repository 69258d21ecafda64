// DistributedSampler: partition, padding/dropping, shuffling by epoch, resume.
#include "cohort/train/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace cohort::train {
namespace {

std::vector<size_t> Flatten(const std::vector<std::vector<size_t>>& batches) {
  std::vector<size_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

TEST(Sampler, PermutationIsDeterministicAndDiffersByEpoch) {
  auto a = DistributedSampler::Permutation(1000, 7, 0);
  auto b = DistributedSampler::Permutation(1000, 7, 0);
  auto c = DistributedSampler::Permutation(1000, 7, 1);
  auto d = DistributedSampler::Permutation(1000, 8, 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  std::vector<size_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_TRUE(DistributedSampler::Permutation(0, 1, 0).empty());
  EXPECT_EQ(DistributedSampler::Permutation(1, 1, 0), std::vector<size_t>{0});
}

TEST(Sampler, RanksPartitionTheEpochWithPadding) {
  for (Partition part : {Partition::kStride, Partition::kContiguous}) {
    const size_t n = 103;
    const int world = 4;
    std::multiset<size_t> seen;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(n, r, world, 8, {.seed = 3, .partition = part});
      s.SetEpoch(2);
      EXPECT_EQ(s.samples_per_rank(), 26u);
      EXPECT_EQ(s.batches_per_epoch(), 4u);  // 8+8+8+2
      auto idx = Flatten(s.Batches());
      EXPECT_EQ(idx, s.RankIndices());
      seen.insert(idx.begin(), idx.end());
    }
    EXPECT_EQ(seen.size(), 104u);
    for (size_t i = 0; i < n; ++i) EXPECT_GE(seen.count(i), 1u) << i;
    // The one pad repeats the permutation's first index.
    size_t first = DistributedSampler::Permutation(n, 3, 2)[0];
    EXPECT_EQ(seen.count(first), 2u);
  }
}

TEST(Sampler, DropRemainderAndLastBatch) {
  const size_t n = 103;
  std::set<size_t> seen;
  for (int r = 0; r < 4; ++r) {
    DistributedSampler s(n, r, 4, 8,
                         {.seed = 3, .remainder = Remainder::kDrop, .drop_last_batch = true});
    EXPECT_EQ(s.samples_per_rank(), 25u);
    EXPECT_EQ(s.batches_per_epoch(), 3u);
    for (const auto& b : s.Batches()) {
      EXPECT_EQ(b.size(), 8u);
      for (size_t i : b) EXPECT_TRUE(seen.insert(i).second) << "duplicate " << i;
    }
  }
  EXPECT_EQ(seen.size(), 96u);
}

TEST(Sampler, StrideBatchesOfWRanksEqualOneProcessWithWTimesB) {
  const size_t n = 1000, b = 16;
  DistributedSampler single(n, 0, 1, 2 * b, {.seed = 11});
  DistributedSampler r0(n, 0, 2, b, {.seed = 11}), r1(n, 1, 2, b, {.seed = 11});
  for (int64_t epoch : {0, 1}) {
    single.SetEpoch(epoch);
    r0.SetEpoch(epoch);
    r1.SetEpoch(epoch);
    for (;;) {
      auto s = single.NextBatch();
      auto a = r0.NextBatch(), c = r1.NextBatch();
      ASSERT_EQ(s.has_value(), a.has_value());
      ASSERT_EQ(s.has_value(), c.has_value());
      if (!s) break;
      std::multiset<size_t> lhs(s->begin(), s->end()), rhs(a->begin(), a->end());
      rhs.insert(c->begin(), c->end());
      ASSERT_EQ(lhs, rhs);
    }
  }
}

TEST(Sampler, ResumeMidEpochContinuesTheSameSequence) {
  DistributedSampler full(500, 1, 3, 7, {.seed = 5});
  full.SetEpoch(4);
  std::vector<std::vector<size_t>> expected;
  while (auto b = full.NextBatch()) expected.push_back(*b);
  DistributedSampler resumed(500, 1, 3, 7, {.seed = 5});
  resumed.SetPosition(4, 9);
  EXPECT_EQ(resumed.position(), 9u);
  std::vector<std::vector<size_t>> got;
  while (auto b = resumed.NextBatch()) got.push_back(*b);
  EXPECT_EQ(got, std::vector<std::vector<size_t>>(expected.begin() + 9, expected.end()));
  EXPECT_EQ(resumed.Batches(9), got);
  resumed.SetPosition(4, resumed.batches_per_epoch());
  EXPECT_FALSE(resumed.NextBatch().has_value());
}

TEST(Sampler, NoShuffleIsInOrder) {
  DistributedSampler s(10, 1, 2, 3, {.shuffle = false});
  EXPECT_EQ(s.RankIndices(), (std::vector<size_t>{1, 3, 5, 7, 9}));
  DistributedSampler c(10, 1, 2, 3, {.shuffle = false, .partition = Partition::kContiguous});
  EXPECT_EQ(c.RankIndices(), (std::vector<size_t>{5, 6, 7, 8, 9}));
}

}  // namespace
}  // namespace cohort::train
