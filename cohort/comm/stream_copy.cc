// Implements StreamCopy with AVX2 streaming stores, chosen at run time. Pure functions.
#include "cohort/comm/stream_copy.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace cohort::comm {
namespace {

constexpr size_t kMinStreamBytes = 4096;

__attribute__((target("avx2"))) void StreamCopyAvx2(char* dst, const char* src, size_t bytes) {
  // Align the destination to 32 bytes with a plain copy, stream the body, copy the tail.
  size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  size_t body = bytes & ~size_t{127};
  for (size_t i = 0; i < body; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + body, src + body, bytes - body);
}

bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
  }();
  return has;
}

}  // namespace

void StreamCopy(void* dst, const void* src, size_t bytes) {
  if (bytes < kMinStreamBytes || !HasAvx2()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  StreamCopyAvx2(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
}

void StreamFence() { _mm_sfence(); }

}  // namespace cohort::comm
