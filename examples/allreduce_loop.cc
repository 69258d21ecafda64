// allreduce_loop: a minimal libcohort worker for `cohort run`: N float allreduces, checking
// each result. With HANG_RANK=r and HANG_AT=k, rank r stops before allreduce k (it sleeps
// in pause(), like a rank stuck in a data loader), which the hang-detection test uses.
// Usage: cohort run --nproc-per-node K allreduce_loop [N]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cohort/base/worker_env.h"
#include "cohort/comm/communicator.h"

using namespace cohort;

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  const char* hang_rank = std::getenv("HANG_RANK");
  const char* hang_at = std::getenv("HANG_AT");
  auto comm = comm::Communicator::FromEnvironment();
  if (!comm.ok()) {
    std::fprintf(stderr, "allreduce_loop: cannot join the job: %s\n",
                 comm.status().ToString().c_str());
    return kExitCannotJoinJob;
  }
  const int rank = (*comm)->rank(), size = (*comm)->size();
  std::vector<float> buf(1024);
  for (int i = 0; i < iters; ++i) {
    if (hang_rank && hang_at && rank == std::atoi(hang_rank) && i == std::atoi(hang_at)) {
      std::printf("rank %d: hanging before allreduce %d\n", rank, i);
      std::fflush(stdout);
      for (;;) ::pause();
    }
    for (auto& x : buf) x = static_cast<float>(rank + 1);
    Status st = (*comm)->AllReduce(buf.data(), buf.data(), buf.size(), comm::DataType::kF32,
                                   comm::ReduceOp::kSum)->Wait();
    if (!st.ok()) {
      std::fprintf(stderr, "allreduce_loop rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
    const float want = size * (size + 1) / 2.0f;
    if (buf[0] != want || buf[1023] != want) {
      std::fprintf(stderr, "allreduce_loop rank %d: wrong result %g, want %g\n", rank, buf[0],
                   want);
      return 3;
    }
  }
  std::printf("rank %d: %d allreduces ok\n", rank, iters);
  return 0;
}
