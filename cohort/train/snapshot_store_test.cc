// SnapshotStore: snapshots published in the node's directory as valid checkpoint files,
// the newest persisted to the checkpoint directory in the background, failed writes retried
// while snapshots go on, older files of a crashed process superseded, and NewestSnapshot's
// choice (newest, memory first on a tie, corrupt copies skipped).
#include "cohort/train/snapshot_store.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "cohort/base/file.h"
#include "cohort/base/temp_dir.h"
#include "cohort/train/checkpoint_file.h"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

// A payload of `n` bytes derived from `step`, written by the filler.
std::string Payload(int64_t step, size_t n) {
  std::string p(n, '\0');
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>((i * 31 + step * 7) & 0xff);
  return p;
}

Status TakeStep(SnapshotStore& store, int64_t step, size_t n = 4096) {
  const std::string payload = Payload(step, n);
  return store.Take(step, fmt::format("{{\"step\":{}}}", step), payload.size(),
                    [&](char* out, uint32_t crc) {
                      std::memcpy(out, payload.data(), payload.size());
                      return Crc32(crc, out, payload.size());
                    });
}

std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

TEST(SnapshotCrc, IsZlibsCrc32InPieces) {
  const std::string data = Payload(3, 100000);
  const uint32_t whole = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
  EXPECT_EQ(Crc32(Crc32(0, data.data(), 777), data.data() + 777, data.size() - 777), whole);
}

TEST(SnapshotStore, PublishesTheNewestInTheNodesDirectory) {
  TempDir mem("snapmem");
  {
    SnapshotStore store({.memory_dir = mem.path(), .rank = 2});
    ASSERT_TRUE(TakeStep(store, 10).ok());
    ASSERT_TRUE(TakeStep(store, 20).ok());
    ASSERT_TRUE(TakeStep(store, 30).ok());
    std::set<std::string> names = Names(mem.path());
    EXPECT_EQ(names.count(SnapshotFileName(2, 30)), 1u);
    EXPECT_EQ(names.count(SnapshotFileName(2, 10)) + names.count(SnapshotFileName(2, 20)), 0u);
    EXPECT_EQ(store.stats().taken, 3);
    EXPECT_EQ(store.stats().in_process, 0);
    // Bounded memory: without a checkpoint directory, two slots (the newest and the one
    // the next snapshot fills), each the snapshot's size.
    ASSERT_TRUE(TakeStep(store, 40).ok());
    names = Names(mem.path());
    EXPECT_EQ(names.size(), 2u) << fmt::format("{}", fmt::join(names, " "));
    for (const std::string& name : names) {
      EXPECT_EQ(fs::file_size(fs::path(mem.path()) / name),
                fs::file_size(fs::path(mem.path()) / SnapshotFileName(2, 40)));
    }
  }
  // After the worker is gone: only the newest snapshot, whole and checksummed.
  EXPECT_EQ(Names(mem.path()), std::set<std::string>{SnapshotFileName(2, 40)});
  auto bytes = ReadFileToString(mem.path() + "/" + SnapshotFileName(2, 40));
  ASSERT_TRUE(bytes.ok());
  auto view = VerifyCheckpoint(*bytes, "snap");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->payload, Payload(40, 4096));
  EXPECT_EQ(std::string(view->meta).find("{\"step\":40}"), 0u);
  EXPECT_EQ((kCheckpointHeaderSize + view->meta.size()) % 64, 0u);  // payload aligned
}

TEST(SnapshotStore, PersistsTheNewestToTheCheckpointDirectory) {
  TempDir mem("snapmem"), disk("snapdisk");
  SnapshotStore store({.memory_dir = mem.path(), .disk_dir = disk.path(), .keep = 2});
  for (int64_t step = 1; step <= 40; ++step) ASSERT_TRUE(TakeStep(store, step, 1 << 16).ok());
  ASSERT_TRUE(store.Flush(Deadline::AfterMs(60000)).ok());
  SnapshotStats st = store.stats();
  EXPECT_EQ(st.taken, 40);
  EXPECT_EQ(st.persisted_step, 40);
  // Every snapshot was written or dropped for a newer one; none waited.
  EXPECT_EQ(st.persisted + st.dropped, 40) << st.persisted << " + " << st.dropped;
  CheckpointDir dir(disk.path());
  std::vector<int64_t> steps = dir.Steps();
  ASSERT_FALSE(steps.empty());
  EXPECT_LE(steps.size(), 2u);
  EXPECT_EQ(steps.back(), 40);
  for (int64_t step : steps) {
    auto bytes = ReadFileToString(dir.PathFor(step));
    ASSERT_TRUE(bytes.ok());
    auto view = VerifyCheckpoint(*bytes, "ckpt");
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_EQ(view->payload, Payload(step, 1 << 16));
  }
}

TEST(SnapshotStore, WithoutANodeDirectoryKeepsSnapshotsInProcessAndPersists) {
  TempDir disk("snapdisk");
  SnapshotStore store({.disk_dir = disk.path()});
  ASSERT_TRUE(TakeStep(store, 5).ok());
  ASSERT_TRUE(store.Flush(Deadline::AfterMs(60000)).ok());
  EXPECT_EQ(CheckpointDir(disk.path()).Steps(), std::vector<int64_t>{5});
}

// A node directory that cannot hold the snapshot (here: gone; in a container: a full
// /dev/shm) keeps the snapshots in the process's memory, said once, and still persists.
TEST(SnapshotStore, WithoutRoomInTheNodeDirectoryKeepsSnapshotsInProcess) {
  TempDir disk("snapdisk");
  SnapshotStore store({.memory_dir = disk.path() + "/gone", .disk_dir = disk.path() + "/ckpt"});
  ASSERT_TRUE(TakeStep(store, 1).ok());
  ASSERT_TRUE(TakeStep(store, 2).ok());
  EXPECT_EQ(store.stats().in_process, 2);
  ASSERT_TRUE(store.Flush(Deadline::AfterMs(60000)).ok());
  EXPECT_EQ(CheckpointDir(disk.path() + "/ckpt").Steps().back(), 2);
}

TEST(SnapshotStore, AFailedWriteIsRetriedWhileSnapshotsGoOn) {
  TempDir mem("snapmem"), root("snapdisk");
  // The checkpoint directory's parent is a file: every write fails until it is removed.
  const std::string blocker = root.path() + "/blocked";
  std::ofstream(blocker) << "x";
  const std::string disk = blocker + "/ckpt";
  SnapshotStore store({.memory_dir = mem.path(), .disk_dir = disk});
  ASSERT_TRUE(TakeStep(store, 1).ok());
  Status flushed = store.Flush(Deadline::AfterMs(300));
  EXPECT_FALSE(flushed.ok());
  EXPECT_NE(flushed.message().find(disk), std::string::npos) << flushed.ToString();
  // Snapshots go on while the disk is unusable.
  ASSERT_TRUE(TakeStep(store, 2).ok());
  ASSERT_TRUE(TakeStep(store, 3).ok());
  EXPECT_EQ(store.stats().taken, 3);
  EXPECT_GE(store.stats().write_failures, 1);
  EXPECT_EQ(Names(mem.path()).count(SnapshotFileName(0, 3)), 1u);
  // Space again: the retry writes the newest snapshot.
  fs::remove(blocker);
  Status ok = store.Flush(Deadline::AfterMs(60000));
  ASSERT_TRUE(ok.ok()) << ok.ToString();
  EXPECT_EQ(CheckpointDir(disk).Steps().back(), 3);
}

TEST(SnapshotStore, SupersedesTheSnapshotsOfAnEarlierProcess) {
  TempDir mem("snapmem");
  { SnapshotStore crashed({.memory_dir = mem.path()}); ASSERT_TRUE(TakeStep(crashed, 7).ok()); }
  {
    SnapshotStore other_rank({.memory_dir = mem.path(), .rank = 1});
    ASSERT_TRUE(TakeStep(other_rank, 3).ok());
  }
  SnapshotStore store({.memory_dir = mem.path()});
  ASSERT_TRUE(TakeStep(store, 9).ok());
  std::set<std::string> names = Names(mem.path());
  EXPECT_EQ(names.count(SnapshotFileName(0, 7)), 0u);
  EXPECT_EQ(names.count(SnapshotFileName(0, 9)), 1u);
  EXPECT_EQ(names.count(SnapshotFileName(1, 3)), 1u);  // another rank's: not ours to remove
}

TEST(NewestSnapshot, PicksTheNewestAndSkipsCorruptCopies) {
  TempDir mem("snapmem"), disk("snapdisk");
  EXPECT_EQ(NewestSnapshot(mem.path(), disk.path()).status().code(), StatusCode::kNotFound);
  {
    SnapshotStore store({.memory_dir = mem.path(), .disk_dir = disk.path()});
    ASSERT_TRUE(TakeStep(store, 4).ok());
    ASSERT_TRUE(store.Flush(Deadline::AfterMs(60000)).ok());
  }
  // A tie: the node's memory is read, not the disk.
  auto tie = NewestSnapshot(mem.path(), disk.path());
  ASSERT_TRUE(tie.ok()) << tie.status().ToString();
  EXPECT_EQ(tie->step, 4);
  EXPECT_NE(tie->where.find("memory"), std::string::npos) << tie->where;
  // A newer snapshot in memory, corrupted: refused by its checksum; the disk's is used.
  {
    SnapshotStore store({.memory_dir = mem.path()});
    ASSERT_TRUE(TakeStep(store, 8).ok());
  }
  const std::string newest = mem.path() + "/" + SnapshotFileName(0, 8);
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  auto found = NewestSnapshot(mem.path(), disk.path());
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->step, 4);
  EXPECT_EQ(found->path, CheckpointDir(disk.path()).PathFor(4));
  ASSERT_TRUE(found->Recheck().ok());
  EXPECT_EQ(found->view.payload, Payload(4, 4096));
  // Nothing readable at all: data loss, not a fresh start.
  fs::remove(CheckpointDir(disk.path()).PathFor(4));
  auto none = NewestSnapshot(mem.path(), disk.path());
  EXPECT_EQ(none.status().code(), StatusCode::kDataLoss) << none.status().ToString();
}

TEST(SnapshotName, RoundTripsAndRejectsOthers) {
  int rank = -1;
  int64_t step = -1;
  ASSERT_TRUE(ParseSnapshotName(SnapshotFileName(3, 1234), &rank, &step));
  EXPECT_EQ(rank, 3);
  EXPECT_EQ(step, 1234);
  for (const char* bad : {"snap-3-12.cohort", "snap--000000000001.cohort", ".slot-0-1",
                          "snap-x-000000000001.cohort", "ckpt-000000000001.cohort"}) {
    EXPECT_FALSE(ParseSnapshotName(bad, &rank, &step)) << bad;
  }
}

}  // namespace
}  // namespace cohort::train
