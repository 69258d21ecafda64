// Readers for image data set files, torch-free: MNIST/Fashion-MNIST idx files (gzip or
// plain, read through zlib's gzread) and CIFAR-10 binary batches. They validate magic
// numbers, dimensions and sizes and return raw uint8 pixels plus labels.
//
// Thread-safety: pure functions of the file contents; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/base/status.h"

namespace cohort::train {

// An idx file: dims (e.g. {60000, 28, 28} for images, {60000} for labels) and its bytes.
struct IdxArray {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Reads an idx file of unsigned bytes (type code 0x08), gzip-compressed or not.
// Errors name the file: NotFound, or DataLoss for a bad magic, a truncated body or
// trailing bytes.
Result<IdxArray> ReadIdxFile(const std::string& path);

// Images [n, channels, height, width] as uint8 and labels [n].
struct ImageSet {
  size_t n = 0;
  int channels = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;
  int num_classes = 10;
};

// `split` is "train" or "t10k" (the file name prefix). Files: <dir>/<split>-images-idx3-ubyte
// and <split>-labels-idx1-ubyte, each optionally with ".gz". Checks that counts agree and
// labels are in [0, 10).
Result<ImageSet> ReadMnist(const std::string& dir, const std::string& split);

// CIFAR-10 binary version: train = data_batch_1..5.bin, test = test_batch.bin, in `dir` or
// in `dir`/cifar-10-batches-bin. Each record is 1 label byte + 3072 pixel bytes.
Result<ImageSet> ReadCifar10(const std::string& dir, bool train);

}  // namespace cohort::train
