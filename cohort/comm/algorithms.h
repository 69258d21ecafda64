// Collective algorithms over the two transports. Each function runs one whole collective
// for the calling member and returns when its part is done; every member of the group must
// call the same function with the same arguments (except buffers), in the same order.
//
//  TCP (any group of ranks on a TcpMesh): pipelined ring (reduce-scatter + all-gather) for
//  large allreduce, Rabenseifner (recursive halving + doubling) for medium, recursive
//  doubling for small (both for any group size: the extra ranks fold in first),
//  binomial trees for broadcast/reduce, ring reduce-scatter/all-gather, pairwise all-to-all,
//  dissemination barrier.
//  Shared memory (ShmGroup): every member copies into its own slot and reads the others'
//  directly; a large allreduce is a reduce-scatter (each member reduces its part once, in
//  rank order) followed by an all-gather from the slots; a small one has every member reduce
//  all slots in rank order (one synchronization). Chunks of slot size, double-buffered.
//
// Results are bit-identical on every rank for a given algorithm.
// Thread-safety: called by the owner thread of the transports.
#pragma once

#include <cstddef>
#include <vector>

#include "cohort/base/status.h"
#include "cohort/base/time.h"
#include "cohort/comm/dtype.h"
#include "cohort/comm/op.h"
#include "cohort/comm/transport/shm/shm_group.h"
#include "cohort/comm/transport/tcp/tcp_mesh.h"

namespace cohort::comm {

// A group of ranks on a TcpMesh: members[i] is the global rank of member i.
struct TcpGroup {
  TcpMesh* mesh = nullptr;
  std::vector<int> members;
  int index = 0;
  int size() const { return static_cast<int>(members.size()); }
};

struct Call {
  const OpDesc& desc;
  Deadline deadline;
  std::vector<char>& scratch;  // reusable temporary buffer of the caller
};

// --- TCP ---
// Out of place: `in` is read, `buf` receives the result (in == buf is allowed).
Status TcpAllReduceRing(TcpGroup& g, const void* in, void* buf, size_t count, DataType t,
                        ReduceOp op, Call c);
Status TcpAllReduceRecursiveDoubling(TcpGroup& g, void* buf, size_t count, DataType t,
                                     ReduceOp op, Call c);
Status TcpAllReduceHalvingDoubling(TcpGroup& g, const void* in, void* buf, size_t count,
                                   DataType t, ReduceOp op, Call c);
Status TcpReduceScatterRing(TcpGroup& g, const void* in, void* out, size_t count, DataType t,
                            ReduceOp op, Call c);
Status TcpAllGatherRing(TcpGroup& g, const void* in, void* out, size_t bytes, Call c);
Status TcpBroadcastTree(TcpGroup& g, void* buf, size_t bytes, int root, Call c);
Status TcpReduceTree(TcpGroup& g, const void* in, void* out, size_t count, DataType t,
                     ReduceOp op, int root, Call c);
Status TcpGather(TcpGroup& g, const void* in, void* out, size_t bytes, int root, Call c);
Status TcpScatter(TcpGroup& g, const void* in, void* out, size_t bytes, int root, Call c);
Status TcpAllToAll(TcpGroup& g, const void* in, void* out, size_t bytes, Call c);
Status TcpBarrier(TcpGroup& g, Call c);

// --- Shared memory ---
Status ShmAllReduce(ShmGroup& g, const void* in, void* out, size_t count, DataType t,
                    ReduceOp op, bool direct, Call c);
Status ShmReduceScatter(ShmGroup& g, const void* in, void* out, size_t count, DataType t,
                        ReduceOp op, Call c);
Status ShmAllGather(ShmGroup& g, const void* in, void* out, size_t bytes, Call c);
Status ShmBroadcast(ShmGroup& g, void* buf, size_t bytes, int root, Call c);
Status ShmReduce(ShmGroup& g, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                 int root, Call c);
Status ShmGather(ShmGroup& g, const void* in, void* out, size_t bytes, int root, Call c);
Status ShmScatter(ShmGroup& g, const void* in, void* out, size_t bytes, int root, Call c);
Status ShmAllToAll(ShmGroup& g, const void* in, void* out, size_t bytes, Call c);
Status ShmBarrier(ShmGroup& g, Call c);

}  // namespace cohort::comm
