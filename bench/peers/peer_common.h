// Shared helpers for the allreduce peer programs in bench/peers/.
//
// Everything here is header-only so that bench/peers/build.sh can compile each
// peer with one plain g++/mpicxx command (these programs are not part of the
// CMake build).
//
// Output follows the nccl-tests text format, which `cohort bench allreduce`
// also prints, so bench/allreduce_compare.py parses one format for everybody:
//
//   # ... header lines start with '#'
//   #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
//           4096          1024     float     sum      -1    12.34    0.33    0.33      0    11.90    0.34    0.34      0
//   # Avg bus bandwidth    : X
//
// time = average per-iteration time in microseconds over the timed iterations,
// maximum over ranks; algbw = size / time (GB/s, GB = 1e9); allreduce busbw =
// algbw * 2(n-1)/n; #wrong = number of wrong elements (summed over ranks),
// or N/A when the check is disabled (-c 0).
#pragma once

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace peers {

struct Options {
  size_t min_bytes = 4096;
  size_t max_bytes = 4096;
  size_t factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int nranks = 2;       // -p (only the self-launching peers use it)
  int timeout_s = 300;  // -T: whole-run timeout; each op also times out
  int threads = 1;      // -t (membw only)
  std::string algos;    // -a (gloo only)
  bool per_call = false;  // -z: a barrier before every timed call, median per-call time
};

inline void die(const char* msg) {
  std::fprintf(stderr, "%s\n", msg);
  std::exit(2);
}

// Parses "4096", "4K", "16M", "1G" (binary multiples, as nccl-tests does).
inline size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || v < 0) die("bad size argument");
  size_t mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; break;
    case 'm': case 'M': mult = 1ull << 20; break;
    case 'g': case 'G': mult = 1ull << 30; break;
    case '\0': break;
    default: die("bad size suffix (use K, M or G)");
  }
  return static_cast<size_t>(v * mult);
}

inline void usage(const char* prog, const char* extra) {
  std::fprintf(stderr,
               "usage: %s [-b minbytes] [-e maxbytes] [-f factor] [-n iters] "
               "[-w warmup] [-c check 0/1] [-T timeout_s]%s\n",
               prog, extra);
  std::exit(2);
}

inline Options parse_args(int argc, char** argv, const char* extra_usage = "") {
  Options o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[0], extra_usage);
      return argv[++i];
    };
    if (a == "-b" || a == "--minbytes") o.min_bytes = parse_size(next());
    else if (a == "-e" || a == "--maxbytes") o.max_bytes = parse_size(next());
    else if (a == "-f" || a == "--stepfactor") o.factor = std::strtoull(next(), nullptr, 10);
    else if (a == "-n" || a == "--iters") o.iters = std::atoi(next());
    else if (a == "-w" || a == "--warmup_iters") o.warmup = std::atoi(next());
    else if (a == "-c" || a == "--check") o.check = std::atoi(next());
    else if (a == "-p" || a == "--nranks") o.nranks = std::atoi(next());
    else if (a == "-T" || a == "--timeout") o.timeout_s = std::atoi(next());
    else if (a == "-t" || a == "--threads") o.threads = std::atoi(next());
    else if (a == "-a" || a == "--algos") o.algos = next();
    else if (a == "-z" || a == "--per-call") o.per_call = true;
    else usage(argv[0], extra_usage);
  }
  if (o.factor < 2) die("-f must be >= 2");
  if (o.iters < 1 || o.warmup < 0) die("-n must be >= 1 and -w >= 0");
  if (o.min_bytes < 4) o.min_bytes = 4;
  if (o.max_bytes < o.min_bytes) o.max_bytes = o.min_bytes;
  if (o.nranks < 1) die("-p must be >= 1");
  if (o.timeout_s < 1) o.timeout_s = 1;
  if (o.threads < 1) o.threads = 1;
  return o;
}

inline std::vector<size_t> sizes(const Options& o) {
  std::vector<size_t> v;
  for (size_t s = o.min_bytes; s <= o.max_bytes; s *= o.factor) {
    v.push_back(s / 4 * 4);  // whole float32 elements
  }
  return v;
}

inline double now_s() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Deterministic small-integer inputs: sums of up to 2^20 ranks stay exact in
// float32, so the check can compare with ==.
inline float input_value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3) % 13) - 6);
}
inline float expected_sum(int nranks, size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; r++) s += input_value(r, i);
  return s;
}
inline void fill_input(float* p, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) p[i] = input_value(rank, i);
}
inline int64_t count_wrong(const float* p, size_t count, int nranks) {
  int64_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    if (p[i] != expected_sum(nranks, i)) wrong++;
  }
  return wrong;
}

// ---- printing (rank 0 only) ----------------------------------------------

inline void print_header(const char* system, const Options& o, int nranks,
                         const std::string& extra = "") {
  std::printf("# %s\n", system);
  std::printf(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(factor) warmup "
      "iters: %d iters: %d agg iters: 1 validation: %d graph: 0\n",
      o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters, o.check);
  std::printf("# nranks %d\n", nranks);
  if (!extra.empty()) std::printf("%s", extra.c_str());
  std::printf("#\n");
  std::printf(
      "#                                                              "
      "out-of-place                       in-place          \n");
  std::printf(
      "#       size         count      type   redop    root     time   algbw "
      "  busbw #wrong     time   algbw   busbw #wrong\n");
  std::printf(
      "#        (B)    (elements)                               (us)  (GB/s) "
      " (GB/s)            (us)  (GB/s)  (GB/s)       \n");
  std::fflush(stdout);
}

struct Result {
  double time_us = 0;
  int64_t wrong = -1;  // -1: not checked (N/A)
};

class Printer {
 public:
  // bus_factor: allreduce 2(n-1)/n.
  explicit Printer(double bus_factor) : bus_factor_(bus_factor) {}

  void line(size_t bytes, size_t count, const char* type, const char* redop,
            const Result& oop, const Result& ip) {
    line(bytes, count, type, redop, oop, ip, bus_factor_, bus_factor_);
  }
  // Per-column bus factors (membw uses different traffic factors per column).
  void line(size_t bytes, size_t count, const char* type, const char* redop,
            const Result& oop, const Result& ip, double f_oop, double f_ip) {
    std::printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, type, redop, -1);
    triple(bytes, oop, f_oop);
    triple(bytes, ip, f_ip);
    std::printf("\n");
    std::fflush(stdout);
  }

  void footer() {
    if (wrong_total_ > 0) {
      std::printf("# Out of bounds values : %" PRId64 " FAILED\n", wrong_total_);
    } else {
      std::printf("# Out of bounds values : 0 OK\n");
    }
    std::printf("# Avg bus bandwidth    : %g \n", n_ ? sum_busbw_ / n_ : 0.0);
    std::printf("#\n");
    std::fflush(stdout);
  }

  int64_t wrong_total() const { return wrong_total_; }

 private:
  void triple(size_t bytes, const Result& r, double factor) {
    double algbw = r.time_us > 0 ? bytes / (r.time_us * 1e3) : 0;  // GB/s
    double busbw = algbw * factor;
    char t[32];
    if (r.time_us >= 10000.0) std::snprintf(t, sizeof t, "%7.0f", r.time_us);
    else if (r.time_us >= 100.0) std::snprintf(t, sizeof t, "%7.1f", r.time_us);
    else std::snprintf(t, sizeof t, "%7.2f", r.time_us);
    char w[32];
    if (r.wrong < 0) std::snprintf(w, sizeof w, "N/A");
    else std::snprintf(w, sizeof w, "%" PRId64, r.wrong);
    std::printf("  %7s  %6.2f  %6.2f  %5s", t, algbw, busbw, w);
    sum_busbw_ += busbw;
    n_++;
    if (r.wrong > 0) wrong_total_ += r.wrong;
  }

  double bus_factor_;
  double sum_busbw_ = 0;
  int n_ = 0;
  int64_t wrong_total_ = 0;
};

inline double allreduce_bus_factor(int n) {
  return n > 1 ? 2.0 * (n - 1) / n : 1.0;
}

}  // namespace peers
