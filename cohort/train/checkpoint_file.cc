// Checkpoint file format and atomic writes (see checkpoint_file.h).
// Thread-safety: no shared state.
#include "cohort/train/checkpoint_file.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "cohort/base/file.h"
#include "cohort/base/log.h"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
constexpr size_t kHeaderSize = kCheckpointHeaderSize;

template <typename T>
void PutLe(char* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

template <typename T>
T GetLe(std::string_view in, size_t off) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<uint8_t>(in[off + i])) << (8 * i);
  }
  return v;
}

Status WriteAll(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write " + path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status FsyncPath(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus("fsync " + path, err);
  return Status::Ok();
}

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), n);
}

void PutCheckpointHeader(char* out, uint32_t crc, uint64_t meta_len, uint64_t payload_len) {
  std::memcpy(out, kMagic, sizeof(kMagic));
  PutLe<uint32_t>(out + 8, kCheckpointVersion);
  PutLe<uint32_t>(out + 12, crc);
  PutLe<uint64_t>(out + 16, meta_len);
  PutLe<uint64_t>(out + 24, payload_len);
}

std::string EncodeCheckpoint(const CheckpointBlob& blob) {
  std::string out(kHeaderSize, '\0');
  const uint32_t crc =
      Crc32(Crc32(0, blob.meta.data(), blob.meta.size()), blob.payload.data(), blob.payload.size());
  PutCheckpointHeader(out.data(), crc, blob.meta.size(), blob.payload.size());
  out.reserve(out.size() + blob.meta.size() + blob.payload.size());
  out += blob.meta;
  out += blob.payload;
  return out;
}

Result<CheckpointBlob> DecodeCheckpoint(const std::string& bytes, const std::string& what) {
  COHORT_ASSIGN_OR_RETURN(CheckpointView view, VerifyCheckpoint(bytes, what));
  return CheckpointBlob{std::string(view.meta), std::string(view.payload)};
}

Result<CheckpointView> VerifyCheckpoint(std::string_view bytes, const std::string& what) {
  if (bytes.size() < kHeaderSize) {
    return DataLoss("{}: truncated: {} bytes, shorter than the {}-byte header", what,
                    bytes.size(), kHeaderSize);
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("{}: not a cohort checkpoint (bad magic)", what);
  }
  uint32_t version = GetLe<uint32_t>(bytes, 8);
  if (version != kCheckpointVersion) {
    return DataLoss("{}: checkpoint version {} is not supported (expected {})", what, version,
                    kCheckpointVersion);
  }
  uint32_t crc = GetLe<uint32_t>(bytes, 12);
  uint64_t meta_len = GetLe<uint64_t>(bytes, 16);
  uint64_t payload_len = GetLe<uint64_t>(bytes, 24);
  uint64_t body = bytes.size() - kHeaderSize;
  if (meta_len > body || payload_len > body - meta_len) {
    return DataLoss("{}: truncated: header announces {} + {} bytes, file holds {}", what,
                    meta_len, payload_len, body);
  }
  if (meta_len + payload_len != body) {
    return DataLoss("{}: {} unexpected trailing bytes", what, body - meta_len - payload_len);
  }
  CheckpointView view{bytes.substr(kHeaderSize, meta_len), bytes.substr(kHeaderSize + meta_len)};
  uint32_t actual = Crc32(Crc32(0, view.meta.data(), view.meta.size()), view.payload.data(),
                          view.payload.size());
  if (actual != crc) {
    return DataLoss("{}: checksum mismatch (stored crc32 {:08x}, computed {:08x})", what, crc,
                    actual);
  }
  return view;
}

// Writes `bytes` to the open file `fd`: a page-aligned buffer of 1 MiB or more goes with
// O_DIRECT (the disk reads it from our memory: no copy into the page cache, a tenth of the
// CPU time for a checkpoint of gigabytes), its unaligned tail and everything else through
// the page cache; a file system without O_DIRECT (tmpfs) gets all of it through the cache.
Status WriteMaybeDirect(int fd, std::string_view bytes, const std::string& path) {
  constexpr size_t kBlock = 4096;
  size_t done = 0;
  const bool aligned = reinterpret_cast<uintptr_t>(bytes.data()) % kBlock == 0;
  const int flags = ::fcntl(fd, F_GETFL);
  if (aligned && bytes.size() >= (size_t{1} << 20) && flags >= 0 &&
      ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0) {
    const size_t direct = bytes.size() / kBlock * kBlock;
    while (done < direct) {
      const ssize_t w = ::write(fd, bytes.data() + done, std::min(direct - done, size_t{8} << 20));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && errno == EINVAL) break;  // not supported here after all: the cache
      if (w < 0) return ErrnoStatus("write " + path, errno);
      done += static_cast<size_t>(w);
    }
    ::fcntl(fd, F_SETFL, flags);
  }
  return WriteAll(fd, bytes.data() + done, bytes.size() - done, path);
}

std::string TemporaryPathFor(const std::string& path, int pid) {
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  return (dir / fmt::format(".{}.tmp.{}", p.filename().string(), pid)).string();
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const std::string tmp = TemporaryPathFor(path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("create " + tmp, errno);
  Status st = WriteMaybeDirect(fd, bytes, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoStatus("fsync " + tmp, errno);
  if (::close(fd) != 0 && st.ok()) st = ErrnoStatus("close " + tmp, errno);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoStatus("rename " + tmp + " to " + path, errno);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return FsyncPath(dir.string(), O_RDONLY | O_DIRECTORY);
}

Result<std::string> ReadWholeFile(const std::string& path) { return ReadFileToString(path); }

std::string CheckpointDir::PathFor(int64_t step) const {
  return (fs::path(dir_) / fmt::format("ckpt-{:012d}.cohort", step)).string();
}

std::vector<int64_t> CheckpointDir::Steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return steps;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::string name = entry.path().filename().string();
    constexpr std::string_view kPrefix = "ckpt-", kSuffix = ".cohort";
    if (name.size() != kPrefix.size() + 12 + kSuffix.size()) continue;
    if (name.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    if (name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) continue;
    std::string digits = name.substr(kPrefix.size(), 12);
    if (!std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    steps.push_back(std::stoll(digits));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

bool CheckpointDir::IsUsable(int64_t step) {
  auto known = usable_.find(step);
  if (known != usable_.end()) return known->second;
  auto bytes = ReadWholeFile(PathFor(step));
  const bool ok = bytes.ok() && VerifyCheckpoint(*bytes, PathFor(step)).ok();
  if (!ok) {
    COHORT_LOG_WARN("train", "checkpoint {} is unusable; it does not count toward --keep",
                    PathFor(step));
  }
  usable_[step] = ok;  // each file is read at most once per process
  return ok;
}

void CheckpointDir::RemoveStaleTemporaries() {
  // WriteFileAtomically's temporaries (TemporaryPathFor) of checkpoint files. Only one
  // process writes into a checkpoint directory, so another pid's is what a killed writer
  // left half-way.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    const size_t tmp = name.find(".cohort.tmp.");
    if (name.rfind(".ckpt-", 0) == 0 && tmp != std::string::npos &&
        name.substr(tmp + 12) != std::to_string(::getpid())) {
      std::error_code rm;
      fs::remove(e.path(), rm);
      if (!rm) COHORT_LOG_INFO("train", "removed {}, left by a writer that was killed", name);
    }
  }
}

Status CheckpointDir::Write(int64_t step, const CheckpointBlob& blob, int keep) {
  return WriteEncoded(step, EncodeCheckpoint(blob), keep);
}

Status CheckpointDir::WriteEncoded(int64_t step, std::string_view file, int keep) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Internal("create checkpoint directory {}: {}", dir_, ec.message());
  COHORT_RETURN_IF_ERROR(WriteFileAtomically(PathFor(step), file));
  usable_[step] = true;
  RemoveStaleTemporaries();
  if (keep <= 0) return Status::Ok();
  // Keep the newest `keep` USABLE checkpoints: a corrupt or truncated file does not count,
  // so it can never push a good one out. Older files than the keep-th usable one go.
  std::vector<int64_t> steps = Steps();
  int usable = 0;
  for (size_t k = steps.size(); k-- > 0;) {
    if (usable >= keep && steps[k] != step) {
      fs::remove(PathFor(steps[k]), ec);
      usable_.erase(steps[k]);
      if (ec) COHORT_LOG_WARN("train", "could not delete old checkpoint {}: {}",
                              PathFor(steps[k]), ec.message());
      continue;
    }
    if (IsUsable(steps[k])) ++usable;
  }
  return Status::Ok();
}

}  // namespace cohort::train
