// idx (gzip) and CIFAR-10 readers on small files written here with zlib, and on the real
// Fashion-MNIST test split when the Debian package is installed.
#include "cohort/train/data_files.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

class DataFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cohort_data_files_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string Idx(std::vector<uint32_t> dims, const std::vector<uint8_t>& data,
                         uint8_t type = 0x08) {
    std::string out = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
    for (uint32_t d : dims) {
      for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((d >> s) & 0xff));
    }
    out.append(data.begin(), data.end());
    return out;
  }
  std::string WriteGz(const std::string& name, const std::string& bytes) {
    std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
    return path;
  }
  std::string WritePlain(const std::string& name, const std::string& bytes) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  fs::path dir_;
};

TEST_F(DataFilesTest, ReadsGzipAndPlainIdx) {
  std::vector<uint8_t> pixels(3 * 2 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 10);
  for (bool gz : {true, false}) {
    std::string bytes = Idx({3, 2, 4}, pixels);
    std::string path = gz ? WriteGz("a.gz", bytes) : WritePlain("a", bytes);
    auto r = ReadIdxFile(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->dims, (std::vector<uint32_t>{3, 2, 4}));
    EXPECT_EQ(r->data, pixels);
  }
}

TEST_F(DataFilesTest, RejectsBadFiles) {
  std::vector<uint8_t> data(12, 1);
  auto expect_error = [&](const std::string& path, StatusCode code, const std::string& needle) {
    auto r = ReadIdxFile(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_EQ(r.status().code(), code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  };
  expect_error((dir_ / "missing.gz").string(), StatusCode::kNotFound, "no such file");
  expect_error(WriteGz("magic.gz", "\x01\x02\x08\x01" + std::string(8, 'x')),
               StatusCode::kDataLoss, "not an idx file");
  expect_error(WriteGz("type.gz", Idx({12}, data, 0x0d)), StatusCode::kDataLoss,
               "not unsigned byte");
  std::string truncated = Idx({3, 4}, data);
  truncated.resize(truncated.size() - 5);
  expect_error(WriteGz("trunc.gz", truncated), StatusCode::kDataLoss, "truncated");
  expect_error(WriteGz("trailing.gz", Idx({3, 4}, data) + "zz"), StatusCode::kDataLoss,
               "trailing");
  expect_error(WriteGz("short.gz", std::string("\0\0", 2)), StatusCode::kDataLoss, "header");
}

TEST_F(DataFilesTest, MnistPairsImagesAndLabels) {
  std::vector<uint8_t> pixels(5 * 28 * 28, 7), labels = {0, 1, 2, 3, 9};
  WriteGz("train-images-idx3-ubyte.gz", Idx({5, 28, 28}, pixels));
  WriteGz("train-labels-idx1-ubyte.gz", Idx({5}, labels));
  auto r = ReadMnist(dir_.string(), "train");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n, 5u);
  EXPECT_EQ(r->height, 28);
  EXPECT_EQ(r->labels, (std::vector<int64_t>{0, 1, 2, 3, 9}));

  WriteGz("t10k-images-idx3-ubyte.gz", Idx({5, 28, 28}, pixels));
  WriteGz("t10k-labels-idx1-ubyte.gz", Idx({4}, {0, 1, 2, 3}));
  auto mismatch = ReadMnist(dir_.string(), "t10k");
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("5 images but"), std::string::npos)
      << mismatch.status().ToString();

  auto missing = ReadMnist((dir_ / "nope").string(), "train");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(DataFilesTest, Cifar10Batches) {
  std::string rec;
  for (int i = 0; i < 3; ++i) {
    rec.push_back(static_cast<char>(i));
    rec.append(3072, static_cast<char>(i * 50));
  }
  WritePlain("test_batch.bin", rec);
  auto r = ReadCifar10(dir_.string(), /*train=*/false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n, 3u);
  EXPECT_EQ(r->channels, 3);
  EXPECT_EQ(r->labels, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(r->pixels[3072 * 2], 100);
  WritePlain("test_batch.bin", rec.substr(0, rec.size() - 1));
  EXPECT_EQ(ReadCifar10(dir_.string(), false).status().code(), StatusCode::kDataLoss);
}

TEST(RealFashionMnist, TestSplitReads) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz")) GTEST_SKIP() << dir << " not installed";
  auto r = ReadMnist(dir, "t10k");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->n, 10000u);
  EXPECT_EQ(r->height, 28);
  EXPECT_EQ(r->width, 28);
  std::vector<int> per_class(10);
  for (int64_t l : r->labels) per_class[l]++;
  for (int c : per_class) EXPECT_EQ(c, 1000);
}

}  // namespace
}  // namespace cohort::train
