// SnapshotStore: checkpoints that do not stop training. Torch-free.
//
// A snapshot is a checkpoint file (checkpoint_file.h format) built in place in a staging
// slot. Take() is the only time training waits: the caller's filler copies the state's
// bytes into the slot and checksums them, the header is written, and the snapshot is
// published at once:
//   - in the node's snapshot directory when there is one (COHORT_SNAPSHOT_DIR: shared
//     memory that the agent owns, so it outlives a crashed worker): every slot is a file
//     there, mapped into this process; publishing renames it to snap-r<rank>-<step>.cohort
//     and the previous snapshot's file becomes a free slot again (its pages are reused);
//   - otherwise in this process's memory only.
// A background thread (the "persister") writes the newest published snapshot to the
// checkpoint directory (CheckpointDir: atomic rename, fsync, newest `keep` kept) when this
// rank persists; after a write of W seconds it starts the next no sooner than 3 W later
// (Flush excepted), so that writing takes at most a quarter of the machine's time. A newer snapshot never waits for an older write: the write in progress
// finishes (a file is never torn) and the newest snapshot is written next; snapshots
// published in between are dropped (counted). A failed write (disk full, I/O error) is
// logged with what to do, counted, and retried with backoff (1 s doubling to 30 s, or at
// once when a newer snapshot arrives) while training goes on.
//
// Memory: at most three slots, each one checkpoint file: one being filled, the newest
// published one, and an older one the persister is still writing (two without a
// checkpoint directory). The first Take reserves its slot; a background thread then
// reserves the others, so later snapshots only copy. In the snapshot
// directory the space is reserved with fallocate before it is touched; when the directory
// is full (a container's small /dev/shm) the snapshot is kept in this process's memory
// instead, with a warning that says how to give the node more shared memory.
//
// Reading: NewestSnapshots() lists the valid snapshots of a snapshot directory and a
// checkpoint directory, newest first (each verified by checksum when it is read).
//
// Thread-safety: Take, Flush and stats from one owner thread (the trainer); the persister
// (at a lower CPU priority) and the reserver threads are internal and joined by the
// destructor (after the write in progress).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/train/checkpoint_file.h"

namespace cohort::train {

struct SnapshotStats {
  int64_t taken = 0;           // snapshots published
  int64_t persisted = 0;       // written to the checkpoint directory
  int64_t dropped = 0;         // superseded before they were written
  int64_t write_failures = 0;  // failed writes (each retried)
  int64_t in_process = 0;      // kept in process memory: the snapshot directory was full
  int64_t last_step = -1;      // newest snapshot's step
  int64_t persisted_step = -1; // newest step written to the checkpoint directory
  double blocking_seconds = 0;       // sum over Take()
  double last_blocking_seconds = 0;  // the last Take()
};

class SnapshotStore {
 public:
  struct Options {
    std::string memory_dir;  // the node's snapshot directory; empty: process memory only
    std::string disk_dir;    // the checkpoint directory; empty: nothing persisted
    int keep = 3;            // checkpoints kept in disk_dir
    int rank = 0;            // names this rank's snapshot files
    // Test hook (COHORT_TRAIN_FAULT_WRITE_STEP): the persister SIGKILLs its own process
    // half-way through writing the first checkpoint file of this step or a later one (a
    // snapshot may be dropped for a newer one). -1: never.
    int64_t fault_write_step = -1;
  };
  explicit SnapshotStore(Options options);
  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  // Copies the payload into `payload` and returns the CRC-32 continued from `crc` over it
  // (checkpoint_file.h's Crc32).
  using Filler = std::function<uint32_t(char* payload, uint32_t crc)>;
  // Takes and publishes the snapshot of `step`: `meta` (JSON text) and a payload of
  // `payload_size` bytes written by `fill`. Errors only when no memory at all could hold it.
  Status Take(int64_t step, const std::string& meta, size_t payload_size, const Filler& fill);
  // Waits until the newest snapshot is in the checkpoint directory (immediately true
  // without one), writing it at once (one write with no gap and no backoff). The error of
  // a write started after the call that fails (not of one already under way); at the
  // deadline, the last write's error or kDeadlineExceeded.
  Status Flush(Deadline deadline);
  SnapshotStats stats() const;
  const Options& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A payload made of pieces (tensors' bytes), each at a 64-byte aligned offset: how both
// cohort-train's and cohort_torch's snapshots lay out their state.
struct PayloadPiece {
  const void* data = nullptr;
  size_t bytes = 0;
  size_t offset = 0;  // in the payload
};
// The pieces' offsets for these sizes, in order; *total: the payload's size.
std::vector<size_t> AlignedOffsets(const std::vector<size_t>& sizes, size_t* total);
// Copies each piece to payload + offset (zeros in between and after, up to `total`),
// checksumming in cache-sized steps as it goes; returns the CRC-32 continued from `crc`
// over payload[0, total). The Filler of a Take.
uint32_t FillPayload(const std::vector<PayloadPiece>& pieces, size_t total, char* payload,
                     uint32_t crc);

// A file mapped read-only (its pages are the page cache's or shared memory's: no copy).
// Writers never truncate a snapshot file that may be mapped (a slot of another size is a
// new file), so reading it cannot fault; its bytes can still change under a reader when
// its writer reuses it: Recheck after copying them. Thread-safety: immutable.
class MappedFile {
 public:
  static Result<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {data_, size_}; }

 private:
  MappedFile(const char* data, size_t size) : data_(data), size_(size) {}
  const char* data_;
  size_t size_;
};

// A valid snapshot or checkpoint found on this node, its bytes verified by checksum.
struct FoundSnapshot {
  int64_t step = -1;
  std::string path;
  std::string where;  // "the node's memory (snapshot of local rank 0)", or the file's path
  std::shared_ptr<const MappedFile> file;
  CheckpointView view;  // into `file`
  // The checksum again: after the bytes were copied, proof that no writer changed them
  // meanwhile (kDataLoss if one did).
  Status Recheck() const;
};

// The newest valid snapshot in `memory_dir` (any rank's: data-parallel ranks hold the same
// state) or checkpoint in `disk_dir`, whichever step is newer (memory first on a tie).
// Files that fail their checksum are skipped with a warning. kNotFound when there is none;
// kDataLoss when files exist but none is readable.
Result<FoundSnapshot> NewestSnapshot(const std::string& memory_dir, const std::string& disk_dir);

// "snap-r<rank>-<step, 12 digits>.cohort"; ParseSnapshotName returns false for other names.
std::string SnapshotFileName(int rank, int64_t step);
bool ParseSnapshotName(const std::string& name, int* rank, int64_t* step);

}  // namespace cohort::train
