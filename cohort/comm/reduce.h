// Vectorized reduction kernels with runtime dispatch: AVX-512, AVX2 or a portable build of
// the same source (reduce_kernels.inc), chosen once from the CPU's features.
// Half types (f16, bf16) are converted to f32, reduced in f32 and rounded once.
//
// Thread-safety: pure functions on caller-owned memory.
#pragma once

#include <cstddef>
#include <string_view>

#include "cohort/comm/dtype.h"

namespace cohort::comm {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[n-1][i]) applied left to right, so every
// caller with the same inputs in the same order gets bit-identical results. For kAvg the
// sum is divided by `avg_divisor`. dst may alias srcs[0] (not the others).
void ReduceMany(void* dst, const void* const* srcs, int n, size_t count, DataType type,
                ReduceOp op, int avg_divisor);

// dst[i] = op(dst[i], src[i]); kAvg accumulates a sum (divide later with FinishAvg).
void ReduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op);

// dst[i] /= divisor for floating types (used after ReduceInto chains for kAvg).
void FinishAvg(void* dst, size_t count, DataType type, int divisor);

// "avx512", "avx2" or "generic".
std::string_view ReduceKernelName();

}  // namespace cohort::comm
