// Test helper: rank 1 of a 2-rank communicator that completes one allreduce and then dies
// ("die": exits without entering the next) or hangs ("hang": blocks in a read that never
// returns). Usage: comm_test_peer STORE_PORT TOKEN TRANSPORT die|hang
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cohort/comm/communicator.h"
#include "cohort/store/tcp_store.h"

using namespace cohort;

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  auto tcp = store::TcpStore::Connect(
      {.host = "127.0.0.1", .port = std::atoi(argv[1]), .token = argv[2]},
      Deadline::AfterMs(10000));
  if (!tcp.ok()) return 3;
  comm::CommOptions o;
  o.transport = argv[3];
  auto comm = comm::Communicator::Create(std::shared_ptr<store::Store>(std::move(tcp).value()),
                                         1, 2, o);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 4;
  }
  std::vector<float> buf(1 << 16, 1.0f);
  if (!(*comm)->AllReduce(buf.data(), buf.data(), buf.size(), comm::DataType::kF32,
                          comm::ReduceOp::kSum)->Wait().ok()) {
    return 5;
  }
  if (std::string(argv[4]) == "die") std::_Exit(0);
  char byte;
  while (::read(0, &byte, 1) != 0 || true) ::pause();  // hang until killed
}
