// The training state through the path cohort-train takes (StateCodec, SnapshotStore,
// NewestSnapshot): exact resume (parameters, optimizer state, RNG) from a checkpoint file
// and from a snapshot in memory, fallback over corrupt and truncated checkpoints, files of
// the earlier format still read, and refusing another model's state or a hostile file.
#include "cohort/train/state_codec.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cohort/train/models.h"
#include "cohort/train/snapshot_store.h"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

const InputShape kShape{1, 8, 8, 10};

class StateCodecTest : public ::testing::Test {
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

// Checkpoints in a directory, as cohort-train writes (a snapshot persisted in the
// background, waited for) and reads them (the newest valid one).
class Checkpoints {
 public:
  // `memory_dir`: snapshots go to the node's memory there instead of the directory.
  Checkpoints(std::string dir, std::string model, std::string opt, int keep,
              std::string memory_dir = "")
      : dir_(std::move(dir)), memory_dir_(std::move(memory_dir)), keep_(keep),
        codec_(std::move(model), std::move(opt)) {}

  Status Save(const TrainState& st, torch::nn::Module& m, torch::optim::Optimizer* o) {
    auto plan = codec_.PlanEncoding(st, m, o);
    if (!plan.ok()) return plan.status();
    SnapshotStore store({.memory_dir = memory_dir_,
                         .disk_dir = memory_dir_.empty() ? dir_ : "",
                         .keep = keep_});
    COHORT_RETURN_IF_ERROR(store.Take(st.global_step, plan->meta, plan->payload_size,
                                      [&](char* p, uint32_t crc) { return plan->Fill(p, crc); }));
    return store.Flush(Deadline::AfterMs(60000));
  }

  Result<TrainState> LoadLatest(torch::nn::Module& m, torch::optim::Optimizer* o) {
    COHORT_ASSIGN_OR_RETURN(FoundSnapshot found, NewestSnapshot(memory_dir_, dir_));
    where_ = found.where;
    return codec_.Decode(found.view, found.path, m, o);
  }
  const std::string& where() const { return where_; }

 private:
  std::string dir_, memory_dir_;
  int keep_;
  StateCodec codec_;
  std::string where_;
};

TEST_F(StateCodecTest, ResumeIsBitIdentical) {
  // From a checkpoint file and from a snapshot in the node's memory.
  for (bool in_memory : {false, true}) {
  for (std::string opt_name : {"sgd", "adam"}) {
    fs::remove_all(dir_);
    const std::string memory = in_memory ? (dir_ / "memory").string() : "";
    if (in_memory) fs::create_directories(memory);
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
    Checkpoints ck(dir_.string(), "mlp", opt_name, 3, memory);
    TrainState st{.global_step = 5, .epoch = 1, .batch_in_epoch = 2, .seed = 77,
                  .world_size = 2, .batch_size = 16};
    ASSERT_TRUE(ck.Save(st, *a, opt_a.get()).ok());
    torch::Tensor next_rand = torch::rand({4});
    for (int s = 5; s < 10; ++s) Step(*a, *opt_a, s);

    torch::manual_seed(12345);  // disturb the generator; Load must restore it
    auto b = Model(2);
    auto opt_b = make_opt(*b);
    Checkpoints ck2(dir_.string(), "mlp", opt_name, 3, memory);
    auto loaded = ck2.LoadLatest(*b, opt_b.get());
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(ck2.where().find("memory") != std::string::npos, in_memory) << ck2.where();
    EXPECT_EQ(loaded->global_step, 5);
    EXPECT_EQ(loaded->epoch, 1);
    EXPECT_EQ(loaded->batch_in_epoch, 2);
    EXPECT_EQ(loaded->seed, 77u);
    EXPECT_EQ(loaded->world_size, 2);
    EXPECT_TRUE(torch::equal(torch::rand({4}), next_rand)) << "generator state not restored";
    for (int s = 5; s < 10; ++s) Step(*b, *opt_b, s);
    EXPECT_TRUE(SameParams(*a, *b)) << opt_name << (in_memory ? " from memory" : " from disk");
  }
  }
}

// A file of the earlier format (the state as a torch archive) is still resumed.
TEST_F(StateCodecTest, TheEarlierTorchArchiveFormatIsStillRead) {
  auto a = Model(1);
  torch::optim::SGD opt_a(a->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int s = 0; s < 3; ++s) Step(*a, opt_a, s);
  torch::serialize::OutputArchive archive, model_archive, opt_archive;
  for (auto& p : a->named_parameters(true)) model_archive.write(p.key(), p.value());
  for (auto& b : a->named_buffers(true)) model_archive.write(b.key(), b.value(), true);
  archive.write("model", model_archive);
  opt_a.save(opt_archive);
  archive.write("optimizer", opt_archive);
  archive.write("rng_torch", at::detail::getDefaultCPUGenerator().get_state(), true);
  std::ostringstream out;
  archive.save_to(out);
  nlohmann::json meta = {{"model", "mlp"}, {"optimizer", "sgd"},
                         {"signature", ModelSignature(*a)}, {"global_step", 3}, {"epoch", 0},
                         {"batch_in_epoch", 3}, {"seed", 1}, {"world_size", 1},
                         {"batch_size", 16}};
  ASSERT_TRUE(CheckpointDir(dir_.string()).Write(3, {meta.dump(), out.str()}, 3).ok());
  for (int s = 3; s < 6; ++s) Step(*a, opt_a, s);

  auto b = Model(2);
  torch::optim::SGD opt_b(b->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto loaded = Checkpoints(dir_.string(), "mlp", "sgd", 3).LoadLatest(*b, &opt_b);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->global_step, 3);
  for (int s = 3; s < 6; ++s) Step(*b, opt_b, s);
  EXPECT_TRUE(SameParams(*a, *b));
}

// Tensor records that do not fit the model (a checksum-valid file from a buggy or hostile
// writer): a data-loss error naming the tensor, and the model untouched.
TEST_F(StateCodecTest, BadTensorRecordsLeaveTheModelUntouched) {
  auto m = Model(1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Step(*m, opt, 0);
  StateCodec codec("mlp", "sgd");
  auto blob = codec.Encode({.global_step = 1, .world_size = 1, .batch_size = 8}, *m, &opt);
  ASSERT_TRUE(blob.ok());
  const nlohmann::json meta = nlohmann::json::parse(blob->meta);
  auto target = Model(5);
  torch::optim::SGD target_opt(target->parameters(), torch::optim::SGDOptions(0.1));
  std::vector<torch::Tensor> before;
  for (auto& p : target->parameters()) before.push_back(p.detach().clone());
  auto edit = [&](auto change) {
    nlohmann::json bad = meta;
    change(bad["tensors"]);
    return codec.Decode(CheckpointBlob{bad.dump(), blob->payload}, "bad", *target, &target_opt);
  };
  std::vector<Result<TrainState>> results;
  results.push_back(edit([](nlohmann::json& t) { t[0][3] = 1ull << 40; }));  // outside
  results.push_back(edit([](nlohmann::json& t) { t[0][1] = "Double"; }));     // dtype
  results.push_back(edit([](nlohmann::json& t) { t[1][2] = {3, 3}; }));       // shape
  results.push_back(edit([](nlohmann::json& t) { t.erase(0); }));             // missing
  results.push_back(edit([](nlohmann::json& t) { t[0][0] = "param:nope"; })); // unknown
  results.push_back(edit([](nlohmann::json& t) { t[0] = "x"; }));            // malformed
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  }
  auto after = target->parameters();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i]));
  EXPECT_TRUE(target_opt.state().empty());
  ASSERT_TRUE(codec.Decode(*blob, "good", *target, &target_opt).ok());
  EXPECT_TRUE(SameParams(*m, *target));
}

TEST_F(StateCodecTest, CorruptOrTruncatedLatestFallsBackToThePrevious) {
  auto m = Model(1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Checkpoints ck(dir_.string(), "mlp", "sgd", 5);
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
  Checkpoints keep2(dir_.string(), "mlp", "sgd", 2);
  ASSERT_TRUE(keep2.Save(TrainState{.global_step = 4}, *m, &opt).ok());
  EXPECT_EQ(cd.Steps(), (std::vector<int64_t>{1, 2, 3, 4}));  // only one usable so far
  ASSERT_TRUE(keep2.Save(TrainState{.global_step = 5}, *m, &opt).ok());
  EXPECT_EQ(cd.Steps(), (std::vector<int64_t>{4, 5}));
}

// A corrupt newest file must not push the older good ones out of the newest-K window.
TEST_F(StateCodecTest, CorruptFilesDoNotCountTowardKeep) {
  auto m = Model(1);
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.1));
  Checkpoints ck(dir_.string(), "mlp", "sgd", 2);
  ASSERT_TRUE(ck.Save(TrainState{.global_step = 1}, *m, &opt).ok());
  ASSERT_TRUE(ck.Save(TrainState{.global_step = 2}, *m, &opt).ok());
  CheckpointDir cd(dir_.string());
  // Another process left a broken step-3 file (a crash mid-copy onto a shared disk).
  { std::ofstream(cd.PathFor(3)) << "not a checkpoint"; }
  Checkpoints other(dir_.string(), "mlp", "sgd", 2);
  ASSERT_TRUE(other.Save(TrainState{.global_step = 4}, *m, &opt).ok());
  // Kept: 4 and 2 (the two newest usable) and the broken 3 between them; 1 is gone.
  EXPECT_EQ(cd.Steps(), (std::vector<int64_t>{2, 3, 4}));
  auto fresh = Model(9);
  auto r = other.LoadLatest(*fresh, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->global_step, 4);
}

TEST_F(StateCodecTest, AnotherModelIsAClearError) {
  auto mlp = Model(1);
  torch::optim::SGD opt(mlp->parameters(), torch::optim::SGDOptions(0.1));
  ASSERT_TRUE(Checkpoints(dir_.string(), "mlp", "sgd", 3).Save({.global_step = 1}, *mlp, &opt).ok());
  auto before = fs::last_write_time(CheckpointDir(dir_.string()).PathFor(1));

  auto cnn = Model(1, "cnn", InputShape{1, 28, 28, 10});
  auto r = Checkpoints(dir_.string(), "cnn", "sgd", 3).LoadLatest(*cnn, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("from model 'mlp', not 'cnn'"), std::string::npos)
      << r.status().ToString();

  // Same name, other shapes (e.g. another input size): names the first difference.
  auto wide = Model(1, "mlp", InputShape{1, 28, 28, 10});
  r = Checkpoints(dir_.string(), "mlp", "sgd", 3).LoadLatest(*wide, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("fc1.weight:Float[512,64]"), std::string::npos)
      << r.status().ToString();

  torch::optim::Adam adam(mlp->parameters());
  r = Checkpoints(dir_.string(), "mlp", "adam", 3).LoadLatest(*mlp, &adam);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(fs::last_write_time(CheckpointDir(dir_.string()).PathFor(1)), before);
}

// A blob whose checksum would verify but whose metadata is hostile: each field out of range
// is a data-loss error naming the field (before: a failed CHECK, or an overflow, later on).
TEST_F(StateCodecTest, HostileMetadataIsADataLossError) {
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
