// DistributedDataParallel: ranks are threads over a MemoryStore. Two ranks with batch B
// must match one process with batch 2B; buckets, bf16 compression, NoSync accumulation and
// unused-parameter handling.
#include "cohort/train/ddp.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <thread>

#include "cohort/store/memory_store.h"
#include "cohort/train/models.h"

namespace cohort::train {
namespace {

constexpr int64_t kB = 8;
const InputShape kShape{1, 8, 8, 10};

// Global batch of step s: 2B samples; rank r takes rows r, r+2, ... (the stride sampler).
std::pair<torch::Tensor, torch::Tensor> GlobalBatch(int64_t step, int64_t size = 2 * kB) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  torch::Tensor x = torch::randn({size, 1, 8, 8}, gen);
  torch::Tensor y = torch::randint(0, 10, {size}, gen);
  return {x, y};
}

std::pair<torch::Tensor, torch::Tensor> RankSlice(const std::pair<torch::Tensor, torch::Tensor>& b,
                                                  int rank, int world) {
  auto idx = torch::arange(rank, b.first.size(0), world);
  return {b.first.index_select(0, idx), b.second.index_select(0, idx)};
}

std::shared_ptr<Classifier> Mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return MakeModel("mlp", kShape).value();
}

double MaxDiff(torch::nn::Module& a, torch::nn::Module& b) {
  double worst = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

// Runs body(rank, comm) on `world` threads, each with its own Communicator.
template <typename Body>
void RunRanks(int world, Body body) {
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comm::CommOptions o;
      o.timeout = std::chrono::seconds(60);
      o.host_id = "h0";
      auto comm = comm::Communicator::Create(store, r, world, o);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

DdpOptions SmallBuckets() {
  DdpOptions o;
  o.first_bucket_bytes = 16 << 10;
  o.bucket_bytes = 256 << 10;
  return o;
}

void TrainSingle(Classifier& model, int steps, double lr) {
  torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = GlobalBatch(s);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(x), y).backward();
    opt.step();
  }
}

void TrainRank(std::shared_ptr<Classifier> model, comm::Communicator& comm, int steps,
               double lr, DdpOptions options) {
  auto ddp = DistributedDataParallel::Create(model, &comm, options);
  ASSERT_TRUE(ddp.ok()) << ddp.status().ToString();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = RankSlice(GlobalBatch(s), comm.rank(), comm.size());
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    Status st = (*ddp)->FinishGradientSync();
    ASSERT_TRUE(st.ok()) << st.ToString();
    opt.step();
  }
  EXPECT_EQ((*ddp)->stats().syncs, steps);
}

class DdpTest : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

TEST_F(DdpTest, TwoRanksWithBatchBMatchOneProcessWith2B) {
  auto single = Mlp(1);
  TrainSingle(*single, 20, 0.05);
  // Rank 1 starts from other weights: construction must broadcast rank 0's.
  std::vector<std::shared_ptr<Classifier>> ranks = {Mlp(1), Mlp(99)};
  RunRanks(2, [&](int r, comm::Communicator& comm) {
    TrainRank(ranks[r], comm, 20, 0.05, SmallBuckets());
  });
  EXPECT_LT(MaxDiff(*single, *ranks[0]), 1e-5);
  EXPECT_EQ(MaxDiff(*ranks[0], *ranks[1]), 0.0) << "ranks diverged";
}

TEST_F(DdpTest, BucketsInReverseRegistrationOrderWithSmallFirstBucket) {
  auto model = Mlp(1);
  RunRanks(2, [&](int r, comm::Communicator& comm) {
    auto m = r == 0 ? model : Mlp(1);
    auto ddp = DistributedDataParallel::Create(m, &comm, SmallBuckets()).value();
    if (r != 0) return;
    auto layout = ddp->BucketLayout();
    // fc3 (10 KiB) fits the 16 KiB first bucket; fc2.weight (512 KiB) gets its own bucket.
    ASSERT_GE(layout.size(), 3u);
    EXPECT_EQ(layout[0], (std::vector<std::string>{"fc3.bias", "fc3.weight", "fc2.bias"}));
    std::vector<std::string> all;
    for (auto& b : layout) all.insert(all.end(), b.begin(), b.end());
    EXPECT_EQ(all, (std::vector<std::string>{"fc3.bias", "fc3.weight", "fc2.bias",
                                             "fc2.weight", "fc1.bias", "fc1.weight"}));
  });
}

TEST_F(DdpTest, Bf16CompressionStaysCloseAndRanksAgree) {
  auto single = Mlp(1);
  TrainSingle(*single, 5, 0.05);
  std::vector<std::shared_ptr<Classifier>> ranks = {Mlp(1), Mlp(1)};
  DdpOptions o = SmallBuckets();
  o.compression = GradCompression::kBf16;
  RunRanks(2, [&](int r, comm::Communicator& comm) { TrainRank(ranks[r], comm, 5, 0.05, o); });
  EXPECT_EQ(MaxDiff(*ranks[0], *ranks[1]), 0.0);
  double diff = MaxDiff(*single, *ranks[0]);
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 1e-2);
}

TEST_F(DdpTest, NoSyncAccumulatesThenAveragesTheSum) {
  // One process: two micro-batches of 2B accumulated. Two ranks: B each, the first
  // backward inside NoSync.
  auto single = Mlp(3);
  {
    torch::optim::SGD opt(single->parameters(), torch::optim::SGDOptions(0.1));
    opt.zero_grad();
    for (int k = 0; k < 2; ++k) {
      auto [x, y] = GlobalBatch(k);
      torch::nn::functional::cross_entropy(single->forward(x), y).backward();
    }
    opt.step();
  }
  std::vector<std::shared_ptr<Classifier>> ranks = {Mlp(3), Mlp(3)};
  RunRanks(2, [&](int r, comm::Communicator& comm) {
    auto ddp = DistributedDataParallel::Create(ranks[r], &comm, SmallBuckets()).value();
    torch::optim::SGD opt(ranks[r]->parameters(), torch::optim::SGDOptions(0.1));
    opt.zero_grad();
    {
      DistributedDataParallel::NoSync no_sync(*ddp);
      auto [x, y] = RankSlice(GlobalBatch(0), r, 2);
      torch::nn::functional::cross_entropy(ranks[r]->forward(x), y).backward();
      EXPECT_TRUE(ddp->FinishGradientSync().ok());  // no-op inside NoSync
    }
    auto [x, y] = RankSlice(GlobalBatch(1), r, 2);
    torch::nn::functional::cross_entropy(ranks[r]->forward(x), y).backward();
    ASSERT_TRUE(ddp->FinishGradientSync().ok());
    opt.step();
    EXPECT_EQ(ddp->stats().syncs, 1);
  });
  EXPECT_LT(MaxDiff(*single, *ranks[0]), 1e-5);
  EXPECT_EQ(MaxDiff(*ranks[0], *ranks[1]), 0.0);
}

struct TwoHeads : torch::nn::Module {
  TwoHeads() {
    torch::manual_seed(5);
    used = register_module("used", torch::nn::Linear(4, 2));
    unused = register_module("unused", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(torch::Tensor x) { return used->forward(x); }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};

TEST_F(DdpTest, UnusedParametersAreZeroFilledOrAnError) {
  std::vector<std::shared_ptr<TwoHeads>> models = {std::make_shared<TwoHeads>(),
                                                   std::make_shared<TwoHeads>()};
  std::vector<std::shared_ptr<TwoHeads>> strict = {std::make_shared<TwoHeads>(),
                                                   std::make_shared<TwoHeads>()};
  RunRanks(2, [&](int r, comm::Communicator& comm) {
    DdpOptions o;
    o.find_unused_parameters = true;
    auto ddp = DistributedDataParallel::Create(models[r], &comm, o).value();
    for (int step = 0; step < 2; ++step) {  // a second step reuses the state cleanly
      models[r]->forward(torch::ones({3, 4}) * (r + 1)).sum().backward();
      Status st = ddp->FinishGradientSync();
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(models[r]->unused->weight.grad().defined());
      EXPECT_EQ(models[r]->unused->weight.grad().abs().sum().item<double>(), 0.0);
      // d(sum)/d(bias) = batch size 3 on both ranks.
      EXPECT_TRUE(models[r]->used->bias.grad().eq(3.0 * (step + 1)).all().item<bool>());
    }

    auto ddp2 = DistributedDataParallel::Create(strict[r], &comm, DdpOptions{}).value();
    strict[r]->forward(torch::ones({3, 4})).sum().backward();
    Status st = ddp2->FinishGradientSync();
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_NE(st.message().find("unused.weight"), std::string::npos) << st.ToString();
    // The communicator is still in step: another collective works.
    int64_t v = 1;
    EXPECT_TRUE(comm.AllReduce(&v, &v, 1, comm::DataType::kI64, comm::ReduceOp::kSum)
                    ->Wait(Deadline::AfterMs(10000)).ok());
    EXPECT_EQ(v, 2);
  });
}

}  // namespace
}  // namespace cohort::train
