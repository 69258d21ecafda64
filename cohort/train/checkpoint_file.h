// The checkpoint file format and directory, torch-free.
//
// A checkpoint file is
//   "COHORTCK" | u32 version | u32 crc32 | u64 meta_len | u64 payload_len | meta | payload
// (integers little-endian; crc32 from zlib over meta + payload). `meta` is JSON text that
// the trainer defines (model name, step, sampler position, ...); `payload` is opaque (the
// torch archive). Files are named ckpt-<step, 12 digits>.cohort and written atomically:
//   1. write to a temporary file in the same directory, 2. fsync it, 3. rename over the
//   final name, 4. fsync the directory; then 5. older checkpoints beyond the last K are
//   deleted, and temporaries a killed writer left. A crash at any point leaves either the
//   old set or the new file complete.
//
// Thread-safety: functions are safe from any thread; two writers on one directory must be
// serialised by the caller (only rank 0 writes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::train {

inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr size_t kCheckpointHeaderSize = 8 + 4 + 4 + 8 + 8;

struct CheckpointBlob {
  std::string meta;
  std::string payload;
};

// The file's two parts, viewed in place (valid while the bytes are).
struct CheckpointView {
  std::string_view meta;
  std::string_view payload;
};

// CRC-32 (zlib's polynomial and values; ISA-L's implementation, ~20 GB/s) of `n` bytes,
// continuing `crc` (0 to start).
uint32_t Crc32(uint32_t crc, const void* data, size_t n);

std::string EncodeCheckpoint(const CheckpointBlob& blob);
// Writes the header of a file with these lengths and checksum (over meta then payload)
// into out[0, kCheckpointHeaderSize): for files built in place.
void PutCheckpointHeader(char* out, uint32_t crc, uint64_t meta_len, uint64_t payload_len);
// DataLoss for a bad magic, unknown version, truncation, trailing bytes or a checksum
// mismatch; the message says which.
Result<CheckpointView> VerifyCheckpoint(std::string_view bytes, const std::string& what);
Result<CheckpointBlob> DecodeCheckpoint(const std::string& bytes, const std::string& what);

// Writes `bytes` to `path` atomically (steps 1-4 above).
Status WriteFileAtomically(const std::string& path, std::string_view bytes);
// The temporary file WriteFileAtomically writes `path` to in process `pid`:
// "<dir>/.<name>.tmp.<pid>".
std::string TemporaryPathFor(const std::string& path, int pid);
Result<std::string> ReadWholeFile(const std::string& path);

class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  std::string PathFor(int64_t step) const;
  // Steps of the checkpoints present, ascending (temporary files are ignored).
  std::vector<int64_t> Steps() const;
  // Creates the directory, writes the checkpoint for `step`, keeps the newest `keep` usable
  // ones (whose checksum verifies) and deletes every older file.
  Status Write(int64_t step, const CheckpointBlob& blob, int keep);
  // The same for a file already encoded (EncodeCheckpoint, or built in place).
  Status WriteEncoded(int64_t step, std::string_view file, int keep);

 private:
  bool IsUsable(int64_t step);  // the file decodes and its checksum verifies (cached)
  void RemoveStaleTemporaries();
  std::string dir_;
  std::map<int64_t, bool> usable_;  // verdict per step: written here, or read once
};

}  // namespace cohort::train
