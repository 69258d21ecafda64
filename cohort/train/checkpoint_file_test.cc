// Checkpoint file format: round trip, truncation and corruption detection, atomic writes,
// keeping the newest K.
#include "cohort/train/checkpoint_file.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointFile, RoundTrip) {
  CheckpointBlob blob{"{\"a\":1}", std::string("pay\0load", 8)};
  auto r = DecodeCheckpoint(EncodeCheckpoint(blob), "x");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->meta, blob.meta);
  EXPECT_EQ(r->payload, blob.payload);
}

TEST(CheckpointFile, DetectsEveryTruncationAndBitFlip) {
  std::string bytes = EncodeCheckpoint({"meta", std::string(300, 'p')});
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto r = DecodeCheckpoint(bytes.substr(0, len), "f");
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x10;
    ASSERT_FALSE(DecodeCheckpoint(bad, "f").ok()) << "flip at " << i;
  }
  auto r = DecodeCheckpoint(bytes + "x", "f");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trailing"), std::string::npos);
  std::string bad = bytes;
  bad[bytes.size() - 1] ^= 1;
  EXPECT_NE(DecodeCheckpoint(bad, "f").status().message().find("checksum"), std::string::npos);
}

TEST(CheckpointFile, DirectoryKeepsNewestAndLeavesNoTemporaries) {
  fs::path dir = fs::temp_directory_path() / ("cohort_ckpt_file_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CheckpointDir cd((dir / "sub").string());
  EXPECT_TRUE(cd.Steps().empty());
  for (int64_t step : {10, 20, 30, 40, 50}) {
    ASSERT_TRUE(cd.Write(step, {"m", std::to_string(step)}, 3).ok());
  }
  EXPECT_EQ(cd.Steps(), (std::vector<int64_t>{30, 40, 50}));
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir / "sub")) {
    ++files;
    EXPECT_EQ(e.path().filename().string().rfind("ckpt-", 0), 0u) << e.path();
  }
  EXPECT_EQ(files, 3u);
  auto bytes = ReadWholeFile(cd.PathFor(40));
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(DecodeCheckpoint(*bytes, "f")->payload, "40");
  fs::remove_all(dir);
}

// A page-aligned buffer of megabytes goes to disk with O_DIRECT, its unaligned tail through
// the page cache; on tmpfs (no O_DIRECT) all of it through the cache. Same bytes each way.
TEST(CheckpointFile, LargeAlignedWritesAreWholeWithOrWithoutODirect) {
  const size_t n = (size_t{3} << 20) + 123;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  char* data = static_cast<char*>(p);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(i * 13 + 5);
  for (fs::path dir : {fs::temp_directory_path(), fs::path("/dev/shm")}) {
    if (!fs::is_directory(dir)) continue;
    const std::string path = (dir / ("cohort_direct_" + std::to_string(::getpid()))).string();
    ASSERT_TRUE(WriteFileAtomically(path, std::string_view(data, n)).ok()) << path;
    auto back = ReadWholeFile(path);
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(*back == std::string_view(data, n)) << path;
    fs::remove(path);
  }
  ::munmap(p, n);
}

}  // namespace
}  // namespace cohort::train
