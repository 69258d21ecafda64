// TCP collective algorithms (see algorithms.h). Thread-safety: owner thread only.
#include <algorithm>
#include <cstring>

#include "cohort/comm/algorithms.h"
#include "cohort/comm/reduce.h"

namespace cohort::comm {
namespace {

char* At(void* p, size_t off) { return static_cast<char*>(p) + off; }
const char* At(const void* p, size_t off) { return static_cast<const char*>(p) + off; }

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Element range of segment s when `count` elements are split into n segments.
std::pair<size_t, size_t> Segment(size_t count, int n, int s) {
  size_t lo = count * static_cast<size_t>(s) / n;
  size_t hi = count * static_cast<size_t>(s + 1) / n;
  return {lo, hi - lo};
}

char* Scratch(Call& c, size_t bytes) {
  if (c.scratch.size() < bytes) c.scratch.resize(bytes);
  return c.scratch.data();
}

// Sends segment `send_seg` to the right while receiving `recv_seg` from the left; each
// piece of the incoming segment is reduced as soon as it arrives, while the send goes on.
// `send_from` holds the segment to send and `acc_from` this rank's own contribution to the
// received segment: `buf` for both, except that the first step of an out-of-place
// allreduce sends from, and adds to, the input (so the input is never copied).
Status RingReduceStep(TcpGroup& g, char* buf, const char* send_from, const char* acc_from,
                      size_t count, size_t es, int send_seg, int recv_seg, DataType t,
                      ReduceOp op, Call& c) {
  const int n = g.size();
  const int right = g.members[Mod(g.index + 1, n)], left = g.members[Mod(g.index - 1, n)];
  auto [s_off, s_len] = Segment(count, n, send_seg);
  auto [r_off, r_len] = Segment(count, n, recv_seg);
  const ReduceOp step_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  auto consume = [&](size_t offset, const char* data, size_t len) {
    const size_t at = (r_off + offset / es) * es;
    const void* srcs[2] = {acc_from + at, data};
    ReduceMany(buf + at, srcs, 2, len / es, t, step_op, 1);
  };
  return g.mesh->SendRecvStream(right, send_from + s_off * es, s_len * es, left, r_len * es, es,
                                consume, c.desc, c.deadline);
}

}  // namespace

Status TcpAllReduceRing(TcpGroup& g, const void* in, void* buf_, size_t count, DataType t,
                        ReduceOp op, Call c) {
  const int n = g.size();
  const size_t es = DataTypeSize(t);
  char* buf = static_cast<char*>(buf_);
  if (n == 1) {
    if (in != buf) std::memmove(buf, in, count * es);
    return Status::Ok();
  }
  const int r = g.index;
  // Reduce-scatter: after n-1 steps this member holds segment r+1 fully reduced. Step 0
  // reads the input directly; later steps send what the previous step reduced.
  for (int s = 0; s < n - 1; ++s) {
    const char* from = s == 0 ? static_cast<const char*>(in) : buf;
    COHORT_RETURN_IF_ERROR(RingReduceStep(g, buf, from, static_cast<const char*>(in), count, es,
                                          Mod(r - s, n), Mod(r - s - 1, n), t, op, c));
  }
  if (op == ReduceOp::kAvg) {
    auto [off, len] = Segment(count, n, Mod(r + 1, n));
    FinishAvg(buf + off * es, len, t, n);
  }
  // All-gather of the reduced segments.
  const int right = g.members[Mod(r + 1, n)], left = g.members[Mod(r - 1, n)];
  for (int s = 0; s < n - 1; ++s) {
    auto [s_off, s_len] = Segment(count, n, Mod(r + 1 - s, n));
    auto [r_off, r_len] = Segment(count, n, Mod(r - s, n));
    COHORT_RETURN_IF_ERROR(g.mesh->SendRecv(right, buf + s_off * es, s_len * es, left,
                                            buf + r_off * es, r_len * es, c.desc, c.deadline));
  }
  return Status::Ok();
}

// Recursive doubling for any n: with p2 the largest power of two <= n and rem = n - p2,
// members below 2*rem pair up (even sends to odd, odd reduces), leaving p2 participants
// that exchange whole buffers log2(p2) times; the evens get the result back at the end.
Status TcpAllReduceRecursiveDoubling(TcpGroup& g, void* buf, size_t count, DataType t,
                                     ReduceOp op, Call c) {
  const int n = g.size();
  if (n == 1) return Status::Ok();
  const size_t bytes = count * DataTypeSize(t);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  const int idx = g.index;
  char* tmp = Scratch(c, bytes + 1);
  const ReduceOp step_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  int vidx;
  if (idx < 2 * rem) {
    if (idx % 2 == 0) {
      COHORT_RETURN_IF_ERROR(g.mesh->Send(g.members[idx + 1], buf, bytes, c.desc, c.deadline));
      vidx = -1;
    } else {
      COHORT_RETURN_IF_ERROR(g.mesh->Recv(g.members[idx - 1], tmp, bytes, c.desc, c.deadline));
      ReduceInto(buf, tmp, count, t, step_op);
      vidx = idx / 2;
    }
  } else {
    vidx = idx - rem;
  }
  if (vidx >= 0) {
    for (int mask = 1; mask < p2; mask <<= 1) {
      int vpeer = vidx ^ mask;
      int peer = g.members[vpeer < rem ? vpeer * 2 + 1 : vpeer + rem];
      COHORT_RETURN_IF_ERROR(g.mesh->SendRecv(peer, buf, bytes, peer, tmp, bytes, c.desc,
                                              c.deadline));
      ReduceInto(buf, tmp, count, t, step_op);
    }
    if (op == ReduceOp::kAvg) FinishAvg(buf, count, t, n);
  }
  if (idx < 2 * rem) {
    if (idx % 2 == 0) {
      COHORT_RETURN_IF_ERROR(g.mesh->Recv(g.members[idx + 1], buf, bytes, c.desc, c.deadline));
    } else {
      COHORT_RETURN_IF_ERROR(g.mesh->Send(g.members[idx - 1], buf, bytes, c.desc, c.deadline));
    }
  }
  return Status::Ok();
}

// Input: n blocks of `count` elements; member r ends with block r reduced.
Status TcpReduceScatterRing(TcpGroup& g, const void* in, void* out, size_t count, DataType t,
                            ReduceOp op, Call c) {
  const int n = g.size();
  const size_t es = DataTypeSize(t), block = count * es;
  if (n == 1) {
    std::memmove(out, in, block);
    if (op == ReduceOp::kAvg) FinishAvg(out, count, t, n);
    return Status::Ok();
  }
  // Work on a copy of the input (blocks are reduced in place as they travel).
  std::vector<char> work(At(in, 0), At(in, block * n));
  const int r = g.index;
  const int right = g.members[Mod(r + 1, n)], left = g.members[Mod(r - 1, n)];
  char* tmp = Scratch(c, block + 1);
  for (int s = 0; s < n - 1; ++s) {
    int send_block = Mod(r - 1 - s, n), recv_block = Mod(r - 2 - s, n);
    COHORT_RETURN_IF_ERROR(g.mesh->SendRecv(right, work.data() + send_block * block, block, left,
                                            tmp, block, c.desc, c.deadline));
    ReduceInto(work.data() + recv_block * block, tmp, count, t, op);
  }
  if (block > 0) std::memcpy(out, work.data() + r * block, block);
  if (op == ReduceOp::kAvg) FinishAvg(out, count, t, n);
  return Status::Ok();
}

// Each member contributes `bytes`; out holds n blocks in member order.
Status TcpAllGatherRing(TcpGroup& g, const void* in, void* out, size_t bytes, Call c) {
  const int n = g.size(), r = g.index;
  if (At(out, r * bytes) != in) std::memmove(At(out, r * bytes), in, bytes);
  const int right = g.members[Mod(r + 1, n)], left = g.members[Mod(r - 1, n)];
  for (int s = 0; s < n - 1; ++s) {
    int send_block = Mod(r - s, n), recv_block = Mod(r - s - 1, n);
    COHORT_RETURN_IF_ERROR(g.mesh->SendRecv(right, At(out, send_block * bytes), bytes, left,
                                            At(out, recv_block * bytes), bytes, c.desc,
                                            c.deadline));
  }
  return Status::Ok();
}

Status TcpBroadcastTree(TcpGroup& g, void* buf, size_t bytes, int root, Call c) {
  const int n = g.size();
  const int v = Mod(g.index - root, n);
  auto member = [&](int rel) { return g.members[Mod(rel + root, n)]; };
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      COHORT_RETURN_IF_ERROR(g.mesh->Recv(member(v - mask), buf, bytes, c.desc, c.deadline));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) {
      COHORT_RETURN_IF_ERROR(g.mesh->Send(member(v + mask), buf, bytes, c.desc, c.deadline));
    }
  }
  return Status::Ok();
}

Status TcpReduceTree(TcpGroup& g, const void* in, void* out, size_t count, DataType t,
                     ReduceOp op, int root, Call c) {
  const int n = g.size();
  const size_t bytes = count * DataTypeSize(t);
  const int v = Mod(g.index - root, n);
  auto member = [&](int rel) { return g.members[Mod(rel + root, n)]; };
  // Accumulate into `out` at the root, into a private buffer elsewhere.
  std::vector<char> own;
  char* acc;
  if (v == 0) {
    acc = static_cast<char*>(out);
  } else {
    own.resize(bytes + 1);
    acc = own.data();
  }
  if (acc != in) std::memmove(acc, in, bytes);
  const ReduceOp step_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  char* tmp = Scratch(c, bytes + 1);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      return g.mesh->Send(member(v & ~mask), acc, bytes, c.desc, c.deadline);
    }
    int src = v | mask;
    if (src < n) {
      COHORT_RETURN_IF_ERROR(g.mesh->Recv(member(src), tmp, bytes, c.desc, c.deadline));
      ReduceInto(acc, tmp, count, t, step_op);
    }
  }
  if (op == ReduceOp::kAvg) FinishAvg(acc, count, t, n);
  return Status::Ok();
}

Status TcpGather(TcpGroup& g, const void* in, void* out, size_t bytes, int root, Call c) {
  if (g.index != root) return g.mesh->Send(g.members[root], in, bytes, c.desc, c.deadline);
  for (int i = 0; i < g.size(); ++i) {
    if (i == root) {
      if (At(out, i * bytes) != in) std::memmove(At(out, i * bytes), in, bytes);
      continue;
    }
    COHORT_RETURN_IF_ERROR(g.mesh->Recv(g.members[i], At(out, i * bytes), bytes, c.desc,
                                        c.deadline));
  }
  return Status::Ok();
}

Status TcpScatter(TcpGroup& g, const void* in, void* out, size_t bytes, int root, Call c) {
  if (g.index != root) return g.mesh->Recv(g.members[root], out, bytes, c.desc, c.deadline);
  for (int i = 0; i < g.size(); ++i) {
    if (i == root) {
      if (At(in, i * bytes) != out) std::memmove(out, At(in, i * bytes), bytes);
      continue;
    }
    COHORT_RETURN_IF_ERROR(g.mesh->Send(g.members[i], At(in, i * bytes), bytes, c.desc,
                                        c.deadline));
  }
  return Status::Ok();
}

Status TcpAllToAll(TcpGroup& g, const void* in, void* out, size_t bytes, Call c) {
  const int n = g.size(), r = g.index;
  std::memmove(At(out, r * bytes), At(in, r * bytes), bytes);
  for (int k = 1; k < n; ++k) {
    int to = Mod(r + k, n), from = Mod(r - k, n);
    COHORT_RETURN_IF_ERROR(g.mesh->SendRecv(g.members[to], At(in, to * bytes), bytes,
                                            g.members[from], At(out, from * bytes), bytes,
                                            c.desc, c.deadline));
  }
  return Status::Ok();
}

Status TcpBarrier(TcpGroup& g, Call c) {
  const int n = g.size(), r = g.index;
  for (int k = 1; k < n; k <<= 1) {
    COHORT_RETURN_IF_ERROR(g.mesh->SendRecv(g.members[Mod(r + k, n)], nullptr, 0,
                                            g.members[Mod(r - k, n)], nullptr, 0, c.desc,
                                            c.deadline));
  }
  return Status::Ok();
}

}  // namespace cohort::comm
