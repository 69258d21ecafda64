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

// Sends `send_bytes` from `send` to member rank `to` while receiving `recv_count` elements
// from `from`; each incoming piece is reduced as soon as it arrives, while the send goes on:
// dst[i] = acc[i] op incoming[i] (dst == acc allowed).
Status ExchangeReduce(TcpMesh& mesh, int to, const char* send, size_t send_bytes, int from,
                      char* dst, const char* acc, size_t recv_count, DataType t, ReduceOp op,
                      Call& c) {
  const size_t es = DataTypeSize(t);
  const ReduceOp step_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  auto consume = [&](size_t offset, const char* data, size_t len) {
    const void* srcs[2] = {acc + offset, data};
    ReduceMany(dst + offset, srcs, 2, len / es, t, step_op, 1);
  };
  return mesh.SendRecvStream(to, send, send_bytes, from, recv_count * es, es, consume, c.desc,
                             c.deadline);
}

// One ring reduce-scatter step: sends segment `send_seg` to the right while reducing
// segment `recv_seg` from the left into `buf`. `send_from` holds the segment to send and
// `acc_from` this rank's own contribution to the received segment: `buf` for both, except
// that the first step of an out-of-place allreduce sends from, and adds to, the input (so
// the input is never copied).
Status RingReduceStep(TcpGroup& g, char* buf, const char* send_from, const char* acc_from,
                      size_t count, size_t es, int send_seg, int recv_seg, DataType t,
                      ReduceOp op, Call& c) {
  const int n = g.size();
  const int right = g.members[Mod(g.index + 1, n)], left = g.members[Mod(g.index - 1, n)];
  auto [s_off, s_len] = Segment(count, n, send_seg);
  auto [r_off, r_len] = Segment(count, n, recv_seg);
  return ExchangeReduce(*g.mesh, right, send_from + s_off * es, s_len * es, left,
                        buf + r_off * es, acc_from + r_off * es, r_len, t, op, c);
}

// Folding for the power-of-two algorithms: with p2 the largest power of two <= n and
// rem = n - p2, members below 2*rem pair up (even sends its buffer to odd, which reduces
// it), leaving p2 participants. Returns this member's virtual index among them, or -1.
struct Fold {
  int p2 = 1, rem = 0;
  int Member(int vidx) const { return vidx < rem ? vidx * 2 + 1 : vidx + rem; }
};

Fold MakeFold(int n) {
  Fold f;
  while (f.p2 * 2 <= n) f.p2 *= 2;
  f.rem = n - f.p2;
  return f;
}

Status FoldIn(TcpGroup& g, const Fold& f, const char* in, char* buf, size_t count, DataType t,
              ReduceOp op, int* vidx, Call& c) {
  const int idx = g.index;
  const size_t bytes = count * DataTypeSize(t);
  if (idx >= 2 * f.rem) {
    *vidx = idx - f.rem;
    if (in != buf) std::memmove(buf, in, bytes);
    return Status::Ok();
  }
  if (idx % 2 == 0) {
    *vidx = -1;
    return g.mesh->Send(g.members[idx + 1], in, bytes, c.desc, c.deadline);
  }
  *vidx = idx / 2;
  return ExchangeReduce(*g.mesh, -1, nullptr, 0, g.members[idx - 1], buf, in, count, t, op, c);
}

// The folded-out evens get the result back from their odd partner.
Status FoldOut(TcpGroup& g, const Fold& f, char* buf, size_t bytes, Call& c) {
  const int idx = g.index;
  if (idx >= 2 * f.rem) return Status::Ok();
  if (idx % 2 == 0) return g.mesh->Recv(g.members[idx + 1], buf, bytes, c.desc, c.deadline);
  return g.mesh->Send(g.members[idx - 1], buf, bytes, c.desc, c.deadline);
}

// A group of one: the result is the input, copied unless in place. True when so.
bool CopiedAlone(int members, const void* in, void* buf, size_t bytes) {
  if (members != 1) return false;
  if (in != buf) std::memmove(buf, in, bytes);
  return true;
}

}  // namespace

Status TcpAllReduceRing(TcpGroup& g, const void* in, void* buf_, size_t count, DataType t,
                        ReduceOp op, Call c) {
  const int n = g.size();
  const size_t es = DataTypeSize(t);
  char* buf = static_cast<char*>(buf_);
  if (CopiedAlone(n, in, buf, count * es)) return Status::Ok();
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

// Recursive doubling for any n (folded to a power of two): the participants exchange whole
// buffers log2(p2) times.
Status TcpAllReduceRecursiveDoubling(TcpGroup& g, void* buf_, size_t count, DataType t,
                                     ReduceOp op, Call c) {
  const int n = g.size();
  if (n == 1) return Status::Ok();
  char* buf = static_cast<char*>(buf_);
  const size_t bytes = count * DataTypeSize(t);
  const Fold f = MakeFold(n);
  int vidx;
  COHORT_RETURN_IF_ERROR(FoldIn(g, f, buf, buf, count, t, op, &vidx, c));
  if (vidx >= 0) {
    // The partial result alternates between buf and scratch: a step sends one while the
    // incoming data is reduced into the other.
    char* cur = buf;
    char* next = Scratch(c, bytes + 1);
    for (int mask = 1; mask < f.p2; mask <<= 1) {
      const int peer = g.members[f.Member(vidx ^ mask)];
      COHORT_RETURN_IF_ERROR(ExchangeReduce(*g.mesh, peer, cur, bytes, peer, next, cur, count, t,
                                            op, c));
      std::swap(cur, next);
    }
    if (cur != buf) std::memcpy(buf, cur, bytes);
    if (op == ReduceOp::kAvg) FinishAvg(buf, count, t, n);
  }
  return FoldOut(g, f, buf, bytes, c);
}

// Rabenseifner (any n, folded to a power of two): a reduce-scatter by recursive halving
// (each step sends half of the current range to the partner across the highest remaining
// bit and reduces the half it keeps), then an all-gather by recursive doubling in reverse.
// Every element is reduced by exactly one participant, so all ranks get identical bits.
Status TcpAllReduceHalvingDoubling(TcpGroup& g, const void* in, void* buf_, size_t count,
                                   DataType t, ReduceOp op, Call c) {
  const int n = g.size();
  const size_t es = DataTypeSize(t);
  char* buf = static_cast<char*>(buf_);
  if (CopiedAlone(n, in, buf, count * es)) return Status::Ok();
  const Fold f = MakeFold(n);
  int vidx;
  COHORT_RETURN_IF_ERROR(
      FoldIn(g, f, static_cast<const char*>(in), buf, count, t, op, &vidx, c));
  if (vidx >= 0) {
    // ranges[k]: the element range held before halving step k.
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t lo = 0, hi = count;
    for (int mask = f.p2 / 2; mask > 0; mask >>= 1) {
      ranges.emplace_back(lo, hi);
      const size_t mid = lo + (hi - lo) / 2;
      const bool keep_low = (vidx & mask) == 0;
      const size_t s_lo = keep_low ? mid : lo, s_hi = keep_low ? hi : mid;
      const size_t k_lo = keep_low ? lo : mid, k_hi = keep_low ? mid : hi;
      const int peer = g.members[f.Member(vidx ^ mask)];
      COHORT_RETURN_IF_ERROR(ExchangeReduce(*g.mesh, peer, buf + s_lo * es, (s_hi - s_lo) * es,
                                            peer, buf + k_lo * es, buf + k_lo * es,
                                            k_hi - k_lo, t, op, c));
      lo = k_lo;
      hi = k_hi;
    }
    if (op == ReduceOp::kAvg) FinishAvg(buf + lo * es, hi - lo, t, n);
    // All-gather: undo the halving steps, last first; the partner holds the other half.
    int k = static_cast<int>(ranges.size()) - 1;
    for (int mask = 1; mask < f.p2; mask <<= 1, --k) {
      auto [p_lo, p_hi] = ranges[k];
      const size_t o_lo = lo == p_lo ? hi : p_lo, o_hi = lo == p_lo ? p_hi : lo;
      const int peer = g.members[f.Member(vidx ^ mask)];
      COHORT_RETURN_IF_ERROR(g.mesh->SendRecv(peer, buf + lo * es, (hi - lo) * es, peer,
                                              buf + o_lo * es, (o_hi - o_lo) * es, c.desc,
                                              c.deadline));
      lo = p_lo;
      hi = p_hi;
    }
  }
  return FoldOut(g, f, buf, count * es, c);
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
