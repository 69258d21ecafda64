// Checkpointer: exact resume (parameters, optimizer state, RNG), fallback over corrupt and
// truncated checkpoints, and refusing another model's checkpoint.
#include "cohort/train/checkpointer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cohort/train/models.h"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

const InputShape kShape{1, 8, 8, 10};

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    dir_ = fs::temp_directory_path() /
           ("cohort_checkpointer_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::shared_ptr<Classifier> Model(uint64_t seed, const std::string& name = "mlp",
                                           InputShape shape = kShape) {
    torch::manual_seed(seed);
    return MakeModel(name, shape).value();
  }
  static void Step(Classifier& model, torch::optim::Optimizer& opt, int64_t s) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(s);
    auto x = torch::randn({16, 1, 8, 8}, gen);
    auto y = torch::randint(0, 10, {16}, gen);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(x), y).backward();
    opt.step();
  }
  static bool SameParams(torch::nn::Module& a, torch::nn::Module& b) {
    auto pa = a.parameters(), pb = b.parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      if (!torch::equal(pa[i], pb[i])) return false;
    }
    return true;
  }

  fs::path dir_;
};

TEST_F(CheckpointerTest, ResumeIsBitIdentical) {
  for (std::string opt_name : {"sgd", "adam"}) {
    fs::remove_all(dir_);
    auto make_opt = [&](Classifier& m) -> std::unique_ptr<torch::optim::Optimizer> {
      if (opt_name == "sgd") {
        return std::make_unique<torch::optim::SGD>(
            m.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      }
      return std::make_unique<torch::optim::Adam>(m.parameters(),
                                                  torch::optim::AdamOptions(1e-3));
    };
    auto a = Model(1);
    auto opt_a = make_opt(*a);
    for (int s = 0; s < 5; ++s) Step(*a, *opt_a, s);
    Checkpointer ck(dir_.string(), "mlp", opt_name, 3);
    TrainState st{.global_step = 5, .epoch = 1, .batch_in_epoch = 2, .seed = 77,
                  .world_size = 2, .batch_size = 16};
    ASSERT_TRUE(ck.Save(st, *a, opt_a.get()).ok());
    torch::Tensor next_rand = torch::rand({4});
    for (int s = 5; s < 10; ++s) Step(*a, *opt_a, s);

    torch::manual_seed(12345);  // disturb the generator; Load must restore it
    auto b = Model(2);
    auto opt_b = make_opt(*b);
    Checkpointer ck2(dir_.string(), "mlp", opt_name, 3);
    auto loaded = ck2.LoadLatest(*b, opt_b.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(loaded->global_step, 5);
    EXPECT_EQ(loaded->epoch, 1);
    EXPECT_EQ(loaded->batch_in_epoch, 2);
    EXPECT_EQ(loaded->seed, 77u);
    EXPECT_EQ(loaded->world_size, 2);
    EXPECT_TRUE(torch::equal(torch::rand({4}), next_rand)) << "generator state not restored";
    for (int s = 5; s < 10; ++s) Step(*b, *opt_b, s);
    EXPECT_TRUE(SameParams(*a, *b)) << opt_name;
  }
}

TEST_F(CheckpointerTest, CorruptOrTruncatedLatestFallsBackToThePrevious) {
  auto m = Model(1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Checkpointer ck(dir_.string(), "mlp", "sgd", 5);
  std::vector<std::vector<torch::Tensor>> snapshots;
  for (int s = 1; s <= 3; ++s) {
    Step(*m, opt, s);
    ASSERT_TRUE(ck.Save(TrainState{.global_step = s}, *m, &opt).ok());
    std::vector<torch::Tensor> snap;
    for (auto& p : m->parameters()) snap.push_back(p.detach().clone());
    snapshots.push_back(snap);
  }
  CheckpointDir cd(dir_.string());
  ASSERT_EQ(cd.Steps(), (std::vector<int64_t>{1, 2, 3}));
  auto expect_restored = [&](int64_t step) {
    auto fresh = Model(9);
    torch::optim::SGD fresh_opt(fresh->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto r = ck.LoadLatest(*fresh, &fresh_opt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->global_step, step);
    auto params = fresh->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i], snapshots[step - 1][i]));
    }
  };
  // Flip one byte in the middle of the newest file: step 2 is used.
  {
    std::fstream f(cd.PathFor(3), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(cd.PathFor(3)) / 2));
    f.put('\x5a');
  }
  expect_restored(2);
  // Truncate step 2 as well (a crash mid-copy): step 1 is used.
  fs::resize_file(cd.PathFor(2), fs::file_size(cd.PathFor(2)) - 100);
  expect_restored(1);
  // Nothing usable left: an error (kDataLoss), not a silent fresh start at step 0.
  fs::resize_file(cd.PathFor(1), 10);
  auto fresh = Model(9);
  auto r = ck.LoadLatest(*fresh, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  // Unusable files do not count toward keep: with keep=2 and three broken files, two new
  // saves are both kept, and the broken ones, older than them, are removed.
  Checkpointer keep2(dir_.string(), "mlp", "sgd", 2);
  ASSERT_TRUE(keep2.Save(TrainState{.global_step = 4}, *m, &opt).ok());
  EXPECT_EQ(cd.Steps(), (std::vector<int64_t>{1, 2, 3, 4}));  // only one usable so far
  ASSERT_TRUE(keep2.Save(TrainState{.global_step = 5}, *m, &opt).ok());
  EXPECT_EQ(cd.Steps(), (std::vector<int64_t>{4, 5}));
}

// A corrupt newest file must not push the older good ones out of the newest-K window.
TEST_F(CheckpointerTest, CorruptFilesDoNotCountTowardKeep) {
  auto m = Model(1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer ck(dir_.string(), "mlp", "sgd", 2);
  ASSERT_TRUE(ck.Save(TrainState{.global_step = 1}, *m, &opt).ok());
  ASSERT_TRUE(ck.Save(TrainState{.global_step = 2}, *m, &opt).ok());
  CheckpointDir cd(dir_.string());
  // Another process left a broken step-3 file (a crash mid-copy onto a shared disk).
  { std::ofstream(cd.PathFor(3)) << "not a checkpoint"; }
  Checkpointer other(dir_.string(), "mlp", "sgd", 2);
  ASSERT_TRUE(other.Save(TrainState{.global_step = 4}, *m, &opt).ok());
  // Kept: 4 and 2 (the two newest usable) and the broken 3 between them; 1 is gone.
  EXPECT_EQ(cd.Steps(), (std::vector<int64_t>{2, 3, 4}));
  auto fresh = Model(9);
  auto r = other.LoadLatest(*fresh, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->global_step, 4);
}

TEST_F(CheckpointerTest, AnotherModelIsAClearError) {
  auto mlp = Model(1);
  torch::optim::SGD opt(mlp->parameters(), torch::optim::SGDOptions(0.1));
  ASSERT_TRUE(Checkpointer(dir_.string(), "mlp", "sgd", 3).Save({.global_step = 1}, *mlp, &opt).ok());
  auto before = fs::last_write_time(CheckpointDir(dir_.string()).PathFor(1));

  auto cnn = Model(1, "cnn", InputShape{1, 28, 28, 10});
  auto r = Checkpointer(dir_.string(), "cnn", "sgd", 3).LoadLatest(*cnn, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("from model 'mlp', not 'cnn'"), std::string::npos)
      << r.status().ToString();

  // Same name, other shapes (e.g. another input size): names the first difference.
  auto wide = Model(1, "mlp", InputShape{1, 28, 28, 10});
  r = Checkpointer(dir_.string(), "mlp", "sgd", 3).LoadLatest(*wide, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("fc1.weight:Float[512,64]"), std::string::npos)
      << r.status().ToString();

  torch::optim::Adam adam(mlp->parameters());
  r = Checkpointer(dir_.string(), "mlp", "adam", 3).LoadLatest(*mlp, &adam);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fs::last_write_time(CheckpointDir(dir_.string()).PathFor(1)), before);
}

// A blob whose checksum would verify but whose metadata is hostile: each field out of range
// is a data-loss error naming the field (before: a failed CHECK, or an overflow, later on).
TEST_F(CheckpointerTest, HostileMetadataIsADataLossError) {
  auto m = Model(1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  StateCodec codec("mlp", "sgd");
  auto blob = codec.Encode({.global_step = 1, .world_size = 1, .batch_size = 8}, *m, &opt);
  ASSERT_TRUE(blob.ok());
  ASSERT_TRUE(codec.Decode(*blob, "good", *m, &opt).ok());
  const nlohmann::json meta = nlohmann::json::parse(blob->meta);
  const std::vector<std::pair<std::string, nlohmann::json>> hostile = {
      {"world_size", -3},   {"world_size", 0},  {"batch_in_epoch", -7},
      {"global_step", 1e30}, {"batch_size", -1}, {"epoch", "1"},
      {"global_step", 18446744073709551615u},    {"seed", -1.5}};
  for (const auto& [key, value] : hostile) {
    nlohmann::json bad = meta;
    bad[key] = value;
    auto r = codec.Decode(CheckpointBlob{bad.dump(), blob->payload}, "hostile", *m, &opt);
    ASSERT_FALSE(r.ok()) << key << "=" << value.dump();
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().ToString();
  }
  // Each in range, their product (a resume at another world size) not.
  nlohmann::json big = meta;
  big["batch_in_epoch"] = int64_t{1} << 50;
  big["batch_size"] = 1 << 20;
  auto overflow = codec.Decode(CheckpointBlob{big.dump(), blob->payload}, "big", *m, &opt);
  EXPECT_EQ(overflow.status().code(), StatusCode::kDataLoss) << overflow.status().ToString();
  EXPECT_NE(overflow.status().message().find("overflows"), std::string::npos);
  // Nested 100,000 deep: refused, not parsed.
  auto deep = codec.Decode(
      CheckpointBlob{std::string(100000, '[') + std::string(100000, ']'), blob->payload}, "deep",
      *m, &opt);
  EXPECT_EQ(deep.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace cohort::train
