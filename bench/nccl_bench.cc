// cohort-bench: nccl-tests-style benchmarks of libcohort collectives. Run under
// `cohort run --nproc-per-node K cohort bench allreduce -b 4K -e 256M -f 2`; standalone it
// runs one rank. Output columns and bus-bandwidth factors follow nccl-tests: GB = 1e9;
// busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n on the total size (reducescatter,
// allgather, alltoall), 1 (broadcast). Thread-safety: single-threaded program.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cohort/base/exit_codes.h"
#include "cohort/base/settings.h"
#include "cohort/base/strings.h"
#include "cohort/base/worker_env.h"
#include "cohort/comm/communicator.h"
#include "cohort/comm/reduce.h"
#include "cohort/net/socket.h"

using namespace cohort;
using namespace cohort::comm;

namespace {

Result<size_t> ParseSize(const std::string& text) {
  std::string t = ToLower(Trim(text));
  size_t mult = 1;
  if (!t.empty() && (t.back() == 'k' || t.back() == 'm' || t.back() == 'g')) {
    mult = t.back() == 'k' ? 1u << 10 : t.back() == 'm' ? 1u << 20 : 1u << 30;
    t.pop_back();
  }
  auto v = ParseInt64(t);
  if (!v || *v < 0) return InvalidArgument("bad size '{}' (examples: 8, 4K, 256M, 1G)", text);
  return static_cast<size_t>(*v) * mult;
}

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll };

double BusFactor(Kind k, int n) {
  switch (k) {
    case Kind::kAllReduce: return 2.0 * (n - 1) / n;
    case Kind::kBroadcast: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}

// Small integers: every reduction is exact in every type.
double Pattern(int rank, size_t i) { return static_cast<double>((rank * 3 + i) % 5) - 2.0; }

// uint8 holds the pattern shifted by +2 (it has no negatives).
void Fill(void* buf, size_t n, DataType t, int rank) {
  const double shift = t == DataType::kU8 ? 2.0 : 0.0;
  for (size_t i = 0; i < n; ++i) SetElement(buf, i, t, Pattern(rank, i) + shift);
}

double Load(const void* buf, size_t i, DataType t) {
  return GetElement(buf, i, t) - (t == DataType::kU8 ? 2.0 : 0.0);
}

double Reduced(ReduceOp op, int n, size_t i, DataType t) {
  double acc = Pattern(0, i);
  for (int r = 1; r < n; ++r) {
    double v = Pattern(r, i);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
    if (op == ReduceOp::kProd) acc *= v;
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
  }
  if (t == DataType::kU8 && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    return std::nan("");  // shifted unsigned pattern: only min/max are checked exactly
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

struct Config {
  Kind kind;
  size_t min_bytes, max_bytes;
  double factor;
  int iters, warmup, check, root;
  bool per_call;  // a barrier before every timed call; the median per-call time
  DataType type;
  ReduceOp op;
};

}  // namespace

// A collective that fails ends the benchmark with its error (exit 1): a figure measured
// over failed calls would be meaningless.
void Must(const Status& s, int rank) {
  if (s.ok()) return;
  std::fprintf(stderr, "cohort bench rank %d: %s\n", rank, s.ToString().c_str());
  std::exit(1);
}

int main(int argc, char** argv) {
  CLI::App app("nccl-tests-style benchmark of cohort collectives", "cohort bench");
  std::string which, b = "8", e = "128M", d = "float", o = "sum";
  double f = 2;
  int n = 20, w = 5, c = 1, r = 0;
  app.add_option("collective", which, "allreduce | reducescatter | allgather | broadcast | alltoall")
      ->required();
  app.add_option("-b,--minbytes", b, "smallest size (8, 4K, 1M, ...)");
  app.add_option("-e,--maxbytes", e, "largest size");
  app.add_option("-f,--stepfactor", f, "multiply the size by this each step");
  app.add_option("-n,--iters", n, "timed iterations per size");
  app.add_option("-w,--warmup_iters", w, "warm-up iterations per size");
  app.add_option("-c,--check", c, "check results (0/1)");
  app.add_option("-d,--datatype", d, "float, double, half, bfloat16, int8, uint8, int32, int64");
  app.add_option("-o,--op", o, "sum, prod, min, max, avg");
  app.add_option("-r,--root", r, "root rank (broadcast)");
  bool per_call = false;
  app.add_flag("-z,--per-call", per_call,
               "a barrier before every timed call and the median per-call time (what a "
               "training step sees), instead of the mean of back-to-back calls");
  CLI11_PARSE(app, argc, argv);

  Config cfg{};
  if (which == "allreduce") cfg.kind = Kind::kAllReduce;
  else if (which == "reducescatter") cfg.kind = Kind::kReduceScatter;
  else if (which == "allgather") cfg.kind = Kind::kAllGather;
  else if (which == "broadcast") cfg.kind = Kind::kBroadcast;
  else if (which == "alltoall") cfg.kind = Kind::kAllToAll;
  else {
    std::fprintf(stderr, "cohort bench: unknown collective '%s'\n", which.c_str());
    return kExitUsage;
  }
  auto minb = ParseSize(b), maxb = ParseSize(e);
  auto type = ParseDataType(d);
  auto op = ParseReduceOp(o);
  for (const Status& s : {minb.status(), maxb.status(), type.status(), op.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "cohort bench: %s\n", s.message().c_str());
      return kExitInvalidValue;
    }
  }
  if (f < 1.0001 || n < 1 || w < 0 || *minb > *maxb) {
    std::fprintf(stderr, "cohort bench: need -f > 1, -n >= 1, -w >= 0 and -b <= -e\n");
    return kExitInvalidValue;
  }
  cfg = {cfg.kind, *minb, *maxb, f, n, w, c, r, per_call, *type, *op};
  if (Status s = CheckOp(cfg.type, cfg.op); !s.ok()) {
    std::fprintf(stderr, "cohort bench: %s\n", s.message().c_str());
    return kExitInvalidValue;
  }

  // Every rank of the job this process was started into (alone when run by hand).
  CommOptions options;
  options.name = "bench";
  auto made = Communicator::FromEnvironment(options);
  if (!made.ok()) {
    std::fprintf(stderr, "cohort bench: cannot join the job: %s\n",
                 made.status().ToString().c_str());
    return kExitCannotJoinJob;
  }
  std::unique_ptr<Communicator> comm = std::move(made).value();
  const int rank = comm->rank(), nranks = comm->size();
  if (cfg.root < 0 || cfg.root >= nranks) {
    std::fprintf(stderr, "cohort bench: root %d is not a rank of %d\n", cfg.root, nranks);
    return kExitInvalidValue;
  }
  const size_t es = DataTypeSize(cfg.type);
  const bool per_rank_blocks = cfg.kind == Kind::kReduceScatter || cfg.kind == Kind::kAllGather ||
                               cfg.kind == Kind::kAllToAll;
  if (rank == 0) {
    std::printf("# cohort bench %s: nranks %d minBytes %zu maxBytes %zu step: %g(factor) warmup "
                "iters: %d iters: %d validation: %d\n#\n# Using devices\n",
                which.c_str(), nranks, cfg.min_bytes, cfg.max_bytes, cfg.factor, cfg.warmup,
                cfg.iters, cfg.check);
  }
  // Rank lines, in rank order.
  for (int i = 0; i < nranks; ++i) {
    if (i == rank) {
      std::printf("#  Rank %2d Pid %6d on %10s device  0 [cpu] %s (reduce kernel %s)\n", rank,
                  static_cast<int>(::getpid()), net::HostName().c_str(),
                  comm->topology().c_str(), std::string(ReduceKernelName()).c_str());
      std::fflush(stdout);
    }
    Must(comm->Barrier()->Wait(), rank);
  }
  if (rank == 0) {
    std::printf("#\n#%80s%33s\n", "out-of-place", "in-place");
    std::printf("#%12s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                "busbw", "#wrong");
    std::printf("#%12s %13s %9s %7s %7s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)",
                "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }
  double busbw_sum = 0;
  int busbw_rows = 0;
  long long wrong_total = 0;
  std::vector<char> in, out;
  for (double sz = static_cast<double>(cfg.min_bytes); sz <= static_cast<double>(cfg.max_bytes) * 1.0000001;
       sz = std::max(sz * cfg.factor, sz + 1)) {
    size_t total = static_cast<size_t>(sz) / es;  // elements of the whole buffer (nccl-tests)
    size_t block = per_rank_blocks ? total / nranks : total;
    total = per_rank_blocks ? block * nranks : total;
    const size_t bytes = total * es;
    size_t in_elems = cfg.kind == Kind::kAllGather ? block : total;
    size_t out_elems = cfg.kind == Kind::kReduceScatter ? block : total;
    in.assign(in_elems * es + 64, 0);
    out.assign(out_elems * es + 64, 0);
    double times[2];
    long long wrong[2];
    for (int inplace = 0; inplace < 2; ++inplace) {
      void* ip = in.data();
      void* op_out = inplace ? in.data() : out.data();
      if (inplace && cfg.kind == Kind::kAllGather) {
        // In-place all-gather: the input is this rank's block of the output buffer.
        in.resize(total * es + 64);
        ip = in.data() + rank * block * es;
        op_out = in.data();
      }
      if (inplace && cfg.kind == Kind::kReduceScatter) {
        ip = in.data();
        op_out = in.data() + rank * block * es;
      }
      auto run = [&]() {
        switch (cfg.kind) {
          case Kind::kAllReduce:
            return comm->AllReduce(ip, op_out, total, cfg.type, cfg.op)->Wait();
          case Kind::kReduceScatter:
            return comm->ReduceScatter(ip, op_out, block, cfg.type, cfg.op)->Wait();
          case Kind::kAllGather: return comm->AllGather(ip, op_out, block, cfg.type)->Wait();
          case Kind::kBroadcast:
            return comm->Broadcast(inplace ? ip : op_out, total, cfg.type, cfg.root)->Wait();
          case Kind::kAllToAll: return comm->AllToAll(ip, op_out, block, cfg.type)->Wait();
        }
        return Status::Ok();
      };
      auto fill = [&]() {
        size_t n_in = cfg.kind == Kind::kAllGather ? block : total;
        Fill(ip, n_in, cfg.type, rank);
        if (cfg.kind == Kind::kBroadcast && !inplace) Fill(op_out, total, cfg.type, rank);
      };
      fill();
      for (int i = 0; i < cfg.warmup; ++i) {
        Status s = run();
        if (!s.ok()) {
          std::fprintf(stderr, "cohort bench rank %d: %s\n", rank, s.ToString().c_str());
          return 1;
        }
      }
      Must(comm->Barrier()->Wait(), rank);
      double local_us;
      if (cfg.per_call) {
        std::vector<double> per(cfg.iters);
        for (int i = 0; i < cfg.iters; ++i) {
          Must(comm->Barrier()->Wait(), rank);
          auto start = SteadyClock::now();
          Must(run(), rank);
          per[i] = SecondsSince(start) * 1e6;
        }
        std::nth_element(per.begin(), per.begin() + per.size() / 2, per.end());
        local_us = per[per.size() / 2];
      } else {
        auto start = SteadyClock::now();
        for (int i = 0; i < cfg.iters; ++i) Must(run(), rank);
        local_us = SecondsSince(start) * 1e6 / cfg.iters;
      }
      double max_us = local_us;
      Must(comm->AllReduce(&local_us, &max_us, 1, DataType::kF64, ReduceOp::kMax)->Wait(),
           rank);
      times[inplace] = max_us;
      // Check: rerun once on fresh inputs and compare with the reference.
      long long bad = 0;
      if (cfg.check) {
        fill();
        Status s = run();
        if (!s.ok()) bad = static_cast<long long>(total);
        for (size_t i = 0; s.ok() && i < out_elems; ++i) {
          double want = 0;
          double got = Load(op_out, i, cfg.type);
          switch (cfg.kind) {
            case Kind::kAllReduce: want = Reduced(cfg.op, nranks, i, cfg.type); break;
            case Kind::kReduceScatter:
              want = Reduced(cfg.op, nranks, rank * block + i, cfg.type);
              break;
            case Kind::kAllGather: want = Pattern(static_cast<int>(i / block), i % block); break;
            case Kind::kBroadcast: want = Pattern(cfg.root, i); break;
            case Kind::kAllToAll:
              want = Pattern(static_cast<int>(i / block), rank * block + i % block);
              break;
          }
          if (std::isnan(want)) continue;
          double tol = cfg.op == ReduceOp::kAvg ? 1e-2 * std::max(1.0, std::fabs(want)) : 0;
          if (std::fabs(got - want) > tol) ++bad;
        }
        long long total_bad = 0;
        Must(comm->AllReduce(&bad, &total_bad, 1, DataType::kI64, ReduceOp::kSum)->Wait(),
             rank);
        bad = total_bad;
      }
      wrong[inplace] = bad;
      wrong_total += bad;
    }
    if (rank == 0) {
      double f_bus = BusFactor(cfg.kind, nranks);
      double alg0 = bytes / (times[0] * 1e3), alg1 = bytes / (times[1] * 1e3);
      auto wrong_text = [&](long long v) {
        return cfg.check ? std::to_string(v) : std::string("N/A");
      };
      std::printf(" %12zu %13zu %9s %7s %7d %8.2f %7.2f %7.2f %6s %8.2f %7.2f %7.2f %6s\n", bytes,
                  total, std::string(DataTypeName(cfg.type)).c_str(),
                  cfg.kind == Kind::kAllReduce || cfg.kind == Kind::kReduceScatter
                      ? std::string(ReduceOpName(cfg.op)).c_str()
                      : "none",
                  cfg.kind == Kind::kBroadcast ? cfg.root : -1, times[0], alg0, alg0 * f_bus,
                  wrong_text(wrong[0]).c_str(), times[1], alg1, alg1 * f_bus,
                  wrong_text(wrong[1]).c_str());
      std::fflush(stdout);
      busbw_sum += alg0 * f_bus;
      ++busbw_rows;
    }
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n#\n", busbw_rows ? busbw_sum / busbw_rows : 0.0);
  }
  return wrong_total ? 1 : 0;
}
