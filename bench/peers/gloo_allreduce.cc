// Gloo C++ (Debian libgloo-dev) float32 sum allreduce, nccl-tests output.
//
//   build/peers/gloo_allreduce -p NRANKS -b 4K -e 256M -f 4 -n 20 -w 5 -c 1
//       [-a ring,ring_chunked,halving_doubling,new_ring,bcube] [-T timeout_s]
//
// The program launches its ranks itself: it forks NRANKS processes on this host,
// which rendezvous through a gloo FileStore in a fresh temp dir and connect a
// full mesh with the TCP transport on 127.0.0.1. For every message size each
// selected algorithm is timed and the best (lowest time) is reported, separately
// for the out-of-place and in-place columns; '#  algo' comment lines show every
// algorithm's numbers.
//
// The legacy algorithms (AllreduceRing, AllreduceRingChunked,
// AllreduceHalvingDoubling, AllreduceBcube) only work in place; their
// out-of-place time includes copying the input into the output buffer first
// (what a caller must do). new_ring is gloo::allreduce() (the options API that
// torch.distributed's gloo backend uses) with a real input and output buffer.
//
// time = average per iteration over -n timed iterations, max over ranks.
// Correctness: after timing, each algorithm is run once more on fresh inputs and
// every element is compared with the exact expected sum (#wrong, summed over
// ranks). Every op times out after -T seconds (gloo context timeout) and the
// launcher kills and reaps all ranks if the whole run exceeds -T seconds.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ftw.h>
#include <functional>
#include <limits>
#include <memory>
#include <sstream>

#include "gloo/allreduce.h"
#include "gloo/allreduce_bcube.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "peer_common.h"

namespace {

using peers::Options;
using peers::Result;

// new_ring (gloo::allreduce, RING) is not in the default set: with 4 ranks on this
// 2-core host it takes seconds per call (3.5 s at 4 MiB, 15.6 s at 16 MiB).
const char* kDefaultAlgos = "ring,ring_chunked,halving_doubling";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Rank {
  int rank;
  int size;
  std::shared_ptr<gloo::Context> ctx;

  void barrier() {
    gloo::BarrierAllToAll b(ctx);
    b.run();
  }
  double max(double v) {
    std::vector<double*> p{&v};
    gloo::AllreduceRing<double> a(ctx, p, 1, gloo::ReductionFunction<double>::max);
    a.run();
    return v;
  }
  double sum(double v) {
    std::vector<double*> p{&v};
    gloo::AllreduceRing<double> a(ctx, p, 1, gloo::ReductionFunction<double>::sum);
    a.run();
    return v;
  }
};

// One selected algorithm bound to (send, recv, count): returns the two ops.
struct Ops {
  std::function<void()> out_of_place;
  std::function<void()> in_place;
  std::shared_ptr<void> keepalive;
};

template <template <typename> class Algo>
Ops legacy(const std::shared_ptr<gloo::Context>& ctx, float* send, float* recv,
           size_t count) {
  std::vector<float*> ptrs{recv};
  auto a = std::make_shared<Algo<float>>(ctx, ptrs, static_cast<int>(count),
                                         gloo::ReductionFunction<float>::sum);
  Ops ops;
  ops.out_of_place = [a, send, recv, count]() {
    std::memcpy(recv, send, count * sizeof(float));
    a->run();
  };
  ops.in_place = [a]() { a->run(); };
  ops.keepalive = a;
  return ops;
}

Ops new_api(const std::shared_ptr<gloo::Context>& ctx, float* send, float* recv,
            size_t count, gloo::AllreduceOptions::Algorithm algo) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  Fn fn = &gloo::sum<float>;
  Ops ops;
  ops.out_of_place = [=]() {
    gloo::AllreduceOptions o(ctx);
    o.setAlgorithm(algo);
    o.setInput(send, count);
    o.setOutput(recv, count);
    o.setReduceFunction(fn);
    o.setTag(1);
    gloo::allreduce(o);
  };
  ops.in_place = [=]() {
    gloo::AllreduceOptions o(ctx);
    o.setAlgorithm(algo);
    o.setOutput(recv, count);
    o.setReduceFunction(fn);
    o.setTag(2);
    gloo::allreduce(o);
  };
  return ops;
}

Ops make_ops(const std::string& name, const std::shared_ptr<gloo::Context>& ctx,
             float* send, float* recv, size_t count) {
  if (name == "ring") return legacy<gloo::AllreduceRing>(ctx, send, recv, count);
  if (name == "ring_chunked") return legacy<gloo::AllreduceRingChunked>(ctx, send, recv, count);
  if (name == "halving_doubling") return legacy<gloo::AllreduceHalvingDoubling>(ctx, send, recv, count);
  if (name == "bcube") return legacy<gloo::AllreduceBcube>(ctx, send, recv, count);
  if (name == "new_ring") return new_api(ctx, send, recv, count, gloo::AllreduceOptions::Algorithm::RING);
  if (name == "new_bcube") return new_api(ctx, send, recv, count, gloo::AllreduceOptions::Algorithm::BCUBE);
  std::fprintf(stderr, "gloo_allreduce: unknown algorithm '%s'\n", name.c_str());
  std::exit(2);
}

double time_op(Rank& r, const std::function<void()>& op, const Options& o) {
  for (int i = 0; i < o.warmup; i++) op();
  r.barrier();
  double t0 = peers::now_s();
  for (int i = 0; i < o.iters; i++) op();
  double t = (peers::now_s() - t0) / o.iters * 1e6;
  return r.max(t);
}

int run_rank(int rank, const Options& o, const std::string& store_dir) {
  Rank r;
  r.rank = rank;
  r.size = o.nranks;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, o.nranks);
  ctx->setTimeout(std::chrono::seconds(o.timeout_s));
  ctx->connectFullMesh(store, dev);
  r.ctx = ctx;

  const auto algos = split(o.algos.empty() ? kDefaultAlgos : o.algos);
  const auto sizes = peers::sizes(o);
  const size_t max_count = sizes.empty() ? 0 : sizes.back() / 4;
  std::vector<float> send(max_count), recv(max_count);
  peers::fill_input(send.data(), max_count, rank);
  peers::fill_input(recv.data(), max_count, rank);

  peers::Printer printer(peers::allreduce_bus_factor(o.nranks));
  if (rank == 0) {
    std::string extra = "# transport tcp 127.0.0.1, rendezvous FileStore, algorithms " +
                        (o.algos.empty() ? std::string(kDefaultAlgos) : o.algos) +
                        " (best per size and column is reported)\n";
    peers::print_header("gloo C++ (libgloo-dev) allreduce", o, o.nranks, extra);
  }

  for (size_t bytes : sizes) {
    const size_t count = bytes / 4;
    Result best_oop, best_ip;
    best_oop.time_us = best_ip.time_us = std::numeric_limits<double>::infinity();
    std::string best_oop_name, best_ip_name;
    for (const auto& name : algos) {
      Ops ops = make_ops(name, ctx, send.data(), recv.data(), count);
      Result oop, ip;
      oop.time_us = time_op(r, ops.out_of_place, o);
      ip.time_us = time_op(r, ops.in_place, o);
      if (o.check) {
        peers::fill_input(send.data(), count, rank);
        std::memset(recv.data(), 0, count * sizeof(float));
        r.barrier();
        ops.out_of_place();
        oop.wrong = static_cast<int64_t>(
            r.sum(static_cast<double>(peers::count_wrong(recv.data(), count, o.nranks))));
        peers::fill_input(recv.data(), count, rank);
        r.barrier();
        ops.in_place();
        ip.wrong = static_cast<int64_t>(
            r.sum(static_cast<double>(peers::count_wrong(recv.data(), count, o.nranks))));
        // Leave inputs in place for the next algorithm / size.
        peers::fill_input(recv.data(), count, rank);
      }
      if (rank == 0) {
        std::printf("#  algo %-16s size %12zu  oop %10.2f us wrong %lld  ip %10.2f us wrong %lld\n",
                    name.c_str(), bytes, oop.time_us, (long long)oop.wrong, ip.time_us,
                    (long long)ip.wrong);
      }
      if (oop.time_us < best_oop.time_us) { best_oop = oop; best_oop_name = name; }
      if (ip.time_us < best_ip.time_us) { best_ip = ip; best_ip_name = name; }
      r.barrier();  // all ranks done with this algorithm before it is destroyed
    }
    if (rank == 0) {
      std::printf("#  best     size %12zu  oop %s  ip %s\n", bytes, best_oop_name.c_str(),
                  best_ip_name.c_str());
      printer.line(bytes, count, "float", "sum", best_oop, best_ip);
    }
  }
  if (rank == 0) printer.footer();
  r.barrier();
  std::fflush(stdout);
  return 0;
}

int remove_cb(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = peers::parse_args(
      argc, argv, " [-p nranks] [-a ring,ring_chunked,halving_doubling,new_ring,bcube,new_bcube]");

  char tmpl[] = "/tmp/gloo_allreduce.XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 2;
  }
  const std::string store_dir = tmpl;

  std::fflush(nullptr);
  const pid_t parent = getpid();
  std::vector<pid_t> kids;
  for (int rank = 0; rank < o.nranks; rank++) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t k : kids) kill(k, SIGKILL);
      break;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(3);
      int rc = 1;
      try {
        rc = run_rank(rank, o, store_dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_allreduce rank %d: %s\n", rank, e.what());
        rc = 1;
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    kids.push_back(pid);
  }

  // Reap all ranks; on the first failure or at the deadline kill the rest.
  int status_rc = kids.size() == static_cast<size_t>(o.nranks) ? 0 : 1;
  const double deadline = peers::now_s() + o.timeout_s;
  size_t alive = kids.size();
  bool killed = false;
  while (alive > 0) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      alive--;
      bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
      if (!ok && !killed) {
        std::fprintf(stderr, "gloo_allreduce: rank pid %d failed (%s %d); killing the others\n",
                     (int)p, WIFEXITED(st) ? "exit" : "signal",
                     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        for (pid_t k : kids) kill(k, SIGKILL);
        killed = true;
        status_rc = 1;
      }
      continue;
    }
    if (p < 0 && errno == ECHILD) break;
    if (!killed && peers::now_s() > deadline) {
      std::fprintf(stderr, "gloo_allreduce: timeout after %d s; killing all ranks\n", o.timeout_s);
      for (pid_t k : kids) kill(k, SIGKILL);
      killed = true;
      status_rc = 124;
    }
    usleep(2000);
  }
  nftw(store_dir.c_str(), remove_cb, 8, FTW_DEPTH | FTW_PHYS);
  return status_rc;
}
