// OpenMPI MPI_Allreduce float32 sum, nccl-tests output.
//
//   mpirun --allow-run-as-root --oversubscribe -np K --mca btl self,vader
//       --timeout 300 build/peers/mpi_allreduce -b 4K -e 256M -f 4 -n 20 -w 5 -c 1
//
// Out-of-place: MPI_Allreduce(send, recv); in-place: MPI_IN_PLACE on recv.
// time = average per iteration over -n timed iterations, max over ranks; with -z, a
// barrier before every timed call and the median per-call time (max over ranks).
// Correctness: after timing, one more call on fresh inputs; every element is
// compared with the exact expected sum (#wrong, summed over ranks).
// -T: the process aborts the whole job (MPI_Abort) if it is still running after
// that many seconds (the driver also passes mpirun --timeout).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <algorithm>
#include <vector>
#include <signal.h>
#include <unistd.h>

#include "peer_common.h"

namespace {

int g_timeout_s = 300;

void on_alarm(int) {
  const char msg[] = "mpi_allreduce: timeout; aborting\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  MPI_Abort(MPI_COMM_WORLD, 124);
  _exit(124);
}

double time_op(void (*op)(float*, float*, int), float* send, float* recv, int count,
               const peers::Options& o) {
  for (int i = 0; i < o.warmup; i++) op(send, recv, count);
  double t;
  if (o.per_call) {  // -z: what a training step sees
    std::vector<double> per(o.iters);
    for (int i = 0; i < o.iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      op(send, recv, count);
      per[i] = (MPI_Wtime() - t0) * 1e6;
    }
    std::nth_element(per.begin(), per.begin() + per.size() / 2, per.end());
    t = per[per.size() / 2];
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < o.iters; i++) op(send, recv, count);
    t = (MPI_Wtime() - t0) / o.iters * 1e6;
  }
  double tmax = 0;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

void oop(float* send, float* recv, int count) {
  MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}
void inp(float*, float* recv, int count) {
  MPI_Allreduce(MPI_IN_PLACE, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

int64_t global_wrong(const float* p, size_t count, int nranks) {
  long long w = peers::count_wrong(p, count, nranks), total = 0;
  MPI_Allreduce(&w, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  peers::Options o = peers::parse_args(argc, argv);
  g_timeout_s = o.timeout_s;
  signal(SIGALRM, on_alarm);
  alarm(static_cast<unsigned>(g_timeout_s));

  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  const auto sizes = peers::sizes(o);
  const size_t max_count = sizes.empty() ? 0 : sizes.back() / 4;
  std::vector<float> send(max_count), recv(max_count);
  peers::fill_input(send.data(), max_count, rank);
  peers::fill_input(recv.data(), max_count, rank);

  peers::Printer printer(peers::allreduce_bus_factor(n));
  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string first(lib);  // NUL-terminated; keep the first line only
    first = first.substr(0, first.find('\n'));
    peers::print_header("MPI_Allreduce", o, n, "# " + first + "\n");
  }
  for (size_t bytes : sizes) {
    const int count = static_cast<int>(bytes / 4);
    peers::Result r_oop, r_ip;
    r_oop.time_us = time_op(oop, send.data(), recv.data(), count, o);
    r_ip.time_us = time_op(inp, send.data(), recv.data(), count, o);
    if (o.check) {
      peers::fill_input(send.data(), count, rank);
      std::memset(recv.data(), 0, count * sizeof(float));
      MPI_Barrier(MPI_COMM_WORLD);
      oop(send.data(), recv.data(), count);
      r_oop.wrong = global_wrong(recv.data(), count, n);
      peers::fill_input(recv.data(), count, rank);
      MPI_Barrier(MPI_COMM_WORLD);
      inp(send.data(), recv.data(), count);
      r_ip.wrong = global_wrong(recv.data(), count, n);
      peers::fill_input(recv.data(), count, rank);
    }
    if (rank == 0) printer.line(bytes, count, "float", "sum", r_oop, r_ip);
  }
  if (rank == 0) printer.footer();
  alarm(0);
  MPI_Finalize();
  return 0;
}
