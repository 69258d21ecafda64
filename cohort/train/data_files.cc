// idx and CIFAR-10 readers (see data_files.h). Thread-safety: no shared state.
#include "cohort/train/data_files.h"

#include <algorithm>
#include <zlib.h>

#include <filesystem>
#include <memory>

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly `len` bytes; returns the number read (less at end of file) or -1.
int64_t GzReadFull(gzFile f, void* buf, size_t len) {
  size_t done = 0;
  auto* p = static_cast<uint8_t*>(buf);
  while (done < len) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(len - done, 1u << 30));
    int got = gzread(f, p + done, chunk);
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return static_cast<int64_t>(done);
}

Status GzError(gzFile f, const std::string& path) {
  int errnum = 0;
  const char* msg = gzerror(f, &errnum);
  return DataLoss("{}: read error: {}", path, msg ? msg : "unknown");
}

// `base` or `base`.gz, whichever exists.
Result<std::string> FindFile(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {name + ".gz", name}) {
    fs::path p = fs::path(dir) / candidate;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return NotFound("{}: neither {} nor {}.gz exists", dir, name, name);
}

}  // namespace

Result<IdxArray> ReadIdxFile(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return NotFound("{}: no such file", path);
  GzPtr f(gzopen(path.c_str(), "rb"));
  if (!f) return ErrnoStatus(path, errno);
  gzbuffer(f.get(), 1 << 20);
  uint8_t header[4];
  int64_t got = GzReadFull(f.get(), header, 4);
  if (got < 0) return GzError(f.get(), path);
  if (got < 4) return DataLoss("{}: truncated idx header ({} bytes)", path, got);
  if (header[0] != 0 || header[1] != 0) {
    return DataLoss("{}: not an idx file (magic {:02x}{:02x}{:02x}{:02x})", path, header[0],
                    header[1], header[2], header[3]);
  }
  if (header[2] != 0x08) {
    return DataLoss("{}: idx element type 0x{:02x} is not unsigned byte (0x08)", path,
                    header[2]);
  }
  const int ndims = header[3];
  if (ndims < 1 || ndims > 4) return DataLoss("{}: idx file with {} dimensions", path, ndims);
  IdxArray out;
  uint64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    uint8_t d[4];
    got = GzReadFull(f.get(), d, 4);
    if (got < 0) return GzError(f.get(), path);
    if (got < 4) return DataLoss("{}: truncated idx header (dimension {})", path, i);
    uint32_t v = (uint32_t{d[0]} << 24) | (uint32_t{d[1]} << 16) | (uint32_t{d[2]} << 8) | d[3];
    out.dims.push_back(v);
    total *= v;
    if (total > (uint64_t{1} << 34)) return DataLoss("{}: implausible idx size", path);
  }
  // Grow with the data actually read, never with what the header claims: a corrupt or
  // hostile header must not allocate gigabytes for a small file.
  constexpr uint64_t kChunk = uint64_t{4} << 20;
  out.data.reserve(std::min(total, kChunk));
  uint64_t have = 0;
  while (have < total) {
    const uint64_t want = std::min(kChunk, total - have);
    out.data.resize(have + want);
    got = GzReadFull(f.get(), out.data.data() + have, static_cast<size_t>(want));
    if (got < 0) return GzError(f.get(), path);
    have += static_cast<uint64_t>(got);
    if (static_cast<uint64_t>(got) < want) {
      return DataLoss("{}: truncated: {} of {} data bytes", path, have, total);
    }
  }
  uint8_t extra;
  got = GzReadFull(f.get(), &extra, 1);
  if (got < 0) return GzError(f.get(), path);
  if (got != 0) return DataLoss("{}: trailing bytes after {} data bytes", path, total);
  return out;
}

Result<ImageSet> ReadMnist(const std::string& dir, const std::string& split) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("data directory {} does not exist", dir);
  COHORT_ASSIGN_OR_RETURN(std::string images_path,
                          FindFile(dir, split + "-images-idx3-ubyte"));
  COHORT_ASSIGN_OR_RETURN(std::string labels_path,
                          FindFile(dir, split + "-labels-idx1-ubyte"));
  COHORT_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  COHORT_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));
  if (images.dims.size() != 3) {
    return DataLoss("{}: expected 3 dimensions (n, rows, cols), found {}", images_path,
                    images.dims.size());
  }
  if (labels.dims.size() != 1) {
    return DataLoss("{}: expected 1 dimension, found {}", labels_path, labels.dims.size());
  }
  if (images.dims[0] != labels.dims[0]) {
    return DataLoss("{} holds {} images but {} holds {} labels", images_path, images.dims[0],
                    labels_path, labels.dims[0]);
  }
  ImageSet set;
  set.n = images.dims[0];
  set.channels = 1;
  set.height = static_cast<int>(images.dims[1]);
  set.width = static_cast<int>(images.dims[2]);
  set.pixels = std::move(images.data);
  set.labels.reserve(set.n);
  for (size_t i = 0; i < set.n; ++i) {
    if (labels.data[i] >= 10) {
      return DataLoss("{}: label {} at index {} is not in [0, 10)", labels_path,
                      labels.data[i], i);
    }
    set.labels.push_back(labels.data[i]);
  }
  return set;
}

Result<ImageSet> ReadCifar10(const std::string& dir, bool train) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound("data directory {} does not exist", dir);
  std::string base = dir;
  if (fs::is_directory(fs::path(dir) / "cifar-10-batches-bin", ec)) {
    base = (fs::path(dir) / "cifar-10-batches-bin").string();
  }
  std::vector<std::string> names;
  if (train) {
    for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  } else {
    names.push_back("test_batch.bin");
  }
  constexpr size_t kRecord = 1 + 3 * 32 * 32;
  ImageSet set;
  set.channels = 3;
  set.height = set.width = 32;
  for (const auto& name : names) {
    COHORT_ASSIGN_OR_RETURN(std::string path, FindFile(base, name));
    GzPtr f(gzopen(path.c_str(), "rb"));
    if (!f) return ErrnoStatus(path, errno);
    std::vector<uint8_t> bytes;
    uint8_t buf[1 << 16];
    for (;;) {
      int64_t got = GzReadFull(f.get(), buf, sizeof(buf));
      if (got < 0) return GzError(f.get(), path);
      bytes.insert(bytes.end(), buf, buf + got);
      if (got < static_cast<int64_t>(sizeof(buf))) break;
    }
    if (bytes.empty() || bytes.size() % kRecord != 0) {
      return DataLoss("{}: {} bytes is not a whole number of {}-byte CIFAR-10 records", path,
                      bytes.size(), kRecord);
    }
    for (size_t off = 0; off < bytes.size(); off += kRecord) {
      if (bytes[off] >= 10) return DataLoss("{}: label {} is not in [0, 10)", path, bytes[off]);
      set.labels.push_back(bytes[off]);
      set.pixels.insert(set.pixels.end(), bytes.begin() + off + 1, bytes.begin() + off + kRecord);
    }
  }
  set.n = set.labels.size();
  return set;
}

}  // namespace cohort::train
