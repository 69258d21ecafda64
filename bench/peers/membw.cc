// Memory bandwidth, measured in the same run as the allreduce peers, printed in
// the nccl-tests format so bench/allreduce_compare.py parses it like the others.
//
//   build/peers/membw -b 256M -e 256M -n 10 -w 2 [-t threads] [-c 1]
//
// For each size S (bytes):
//   out-of-place column = STREAM-like copy   dst[i] = src[i]     (memcpy)
//       algbw = S/time, busbw = memory traffic = (S read + S written)/time
//   in-place column     = reduction kernel    a[i] += b[i]   (float32)
//       algbw = S/time, busbw = memory traffic = (2S read + S written)/time
// redop column says "copy". busbw of the copy at a size much larger than the
// last-level cache (256 MiB) is B_mem, the read+write memory bandwidth used for
// the shared-memory allreduce bound (see bench/allreduce_compare.py):
//   every one of n ranks must at least read its S-byte input and write its
//   S-byte output through the one memory system: traffic >= 2nS, so
//   time >= 2nS/B_mem, algbw <= B_mem/(2n), busbw <= B_mem/(2n) * 2(n-1)/n.
// -t T splits each kernel over T OpenMP threads (default 1 = single thread).
// time = average per iteration over -n timed iterations.
#include <omp.h>

#include "peer_common.h"

namespace {

void copy_kernel(float* dst, const float* src, size_t count, int threads) {
  if (threads == 1) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t chunk = (count + nt - 1) / nt;
    size_t lo = std::min(count, chunk * t), hi = std::min(count, lo + chunk);
    std::memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
  }
}

void add_kernel(float* a, const float* b, size_t count, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (size_t i = 0; i < count; i++) a[i] += b[i];
}

void fill(float* p, size_t count, int rank, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (size_t i = 0; i < count; i++) p[i] = peers::input_value(rank, i);
}

template <typename F>
double time_us(F op, const peers::Options& o) {
  for (int i = 0; i < o.warmup; i++) op();
  double t0 = peers::now_s();
  for (int i = 0; i < o.iters; i++) op();
  return (peers::now_s() - t0) / o.iters * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  peers::Options o = peers::parse_args(argc, argv, " [-t threads]");
  const auto sizes = peers::sizes(o);
  const size_t max_count = sizes.empty() ? 0 : sizes.back() / 4;
  // Separate allocations, first-touched by the threads that use them.
  float* src = static_cast<float*>(std::aligned_alloc(64, ((max_count * 4 + 63) / 64) * 64 + 64));
  float* dst = static_cast<float*>(std::aligned_alloc(64, ((max_count * 4 + 63) / 64) * 64 + 64));
  if (!src || !dst) peers::die("membw: out of memory");
  fill(src, max_count, 0, o.threads);
  fill(dst, max_count, 1, o.threads);

  std::string extra =
      "# threads " + std::to_string(o.threads) +
      "; out-of-place = copy dst=src (busbw = (read+write bytes)/time = 2S/time = B_mem),"
      " in-place = float a+=b (busbw = 3S/time)\n";
  peers::print_header("membw (memory bandwidth)", o, 1, extra);
  peers::Printer printer(2.0);
  for (size_t bytes : sizes) {
    const size_t count = bytes / 4;
    peers::Result c, a;
    c.time_us = time_us([&] { copy_kernel(dst, src, count, o.threads); }, o);
    a.time_us = time_us([&] { add_kernel(dst, src, count, o.threads); }, o);
    if (o.check) {
      fill(dst, count, 1, o.threads);
      copy_kernel(dst, src, count, o.threads);
      c.wrong = 0;
      for (size_t i = 0; i < count; i++) c.wrong += dst[i] != peers::input_value(0, i);
      fill(dst, count, 1, o.threads);
      add_kernel(dst, src, count, o.threads);
      a.wrong = peers::count_wrong(dst, count, 2);
    }
    printer.line(bytes, count, "float", "copy", c, a, 2.0, 3.0);
  }
  printer.footer();
  std::free(src);
  std::free(dst);
  return 0;
}
