// TcpMesh: one TCP connection between every pair of ranks of a group, set up through a
// Store, and the blocking transfers the collective algorithms are written against.
//
// Setup steps (Create):
//  1. Listen on port 0; publish "<addr>:<port>/<nonce>" under <prefix>/tcp/<rank>.
//  2. Connect to every lower rank and send HELLO(rank, that rank's nonce): only a process
//     that can read the store (and so holds the job token) can join the mesh.
//  3. Accept every higher rank; check its nonce and rank.
// Every message carries the sender's OpDesc; the receiver compares it with its own and
// fails with both descriptions on a mismatch.
//
// Thread-safety: one owner thread (the communicator's runner). Abort() may be called from
// any thread: it shuts every socket down, which unblocks the owner.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/comm/op.h"
#include "cohort/net/socket.h"
#include "cohort/store/store.h"

namespace cohort::comm {

class TcpMesh {
 public:
  static Result<std::unique_ptr<TcpMesh>> Create(store::Store& store, const std::string& prefix,
                                                 int rank, int size,
                                                 const std::string& listen_addr,
                                                 Deadline deadline);
  ~TcpMesh();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Sends `ssize` bytes to `to` while receiving `rsize` bytes from `from`, both tagged with
  // `desc`; either peer may be -1. Full duplex, so rings never deadlock on socket buffers.
  Status SendRecv(int to, const void* sbuf, size_t ssize, int from, void* rbuf, size_t rsize,
                  const OpDesc& desc, Deadline deadline);
  // Like SendRecv, but the received payload is not stored: it is handed to `consume` in
  // pieces (multiples of `align` bytes, in order) as it arrives, while sending continues.
  // Lets a ring step reduce incoming data without waiting for the whole segment.
  using Consumer = std::function<void(size_t offset, const char* data, size_t len)>;
  Status SendRecvStream(int to, const void* sbuf, size_t ssize, int from, size_t rsize,
                        size_t align, const Consumer& consume, const OpDesc& desc,
                        Deadline deadline);
  Status Send(int to, const void* buf, size_t size, const OpDesc& desc, Deadline deadline) {
    return SendRecv(to, buf, size, -1, nullptr, 0, desc, deadline);
  }
  Status Recv(int from, void* buf, size_t size, const OpDesc& desc, Deadline deadline) {
    return SendRecv(-1, nullptr, 0, from, buf, size, desc, deadline);
  }
  void Abort();

 private:
  TcpMesh(int rank, int size) : rank_(rank), size_(size), peers_(size), where_(size) {}
  Status Transfer(int to, const void* sbuf, size_t ssize, int from, void* rbuf, size_t rsize,
                  size_t align, const Consumer* consume, const OpDesc& desc, Deadline deadline);
  const int rank_, size_;
  std::vector<net::Socket> peers_;
  // Each peer's host as this rank knows it (the address it published, or the one it
  // connected from): errors name the host of a peer that went away, not only its rank.
  std::vector<std::string> where_;
  std::vector<char> stage_;  // receive staging for SendRecvStream
};

}  // namespace cohort::comm
