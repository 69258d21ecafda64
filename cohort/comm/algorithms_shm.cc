// Shared-memory collective algorithms (see algorithms.h and shm_group.h for the slot and
// counter protocol). Thread-safety: owner thread only.
#include <algorithm>
#include <cstring>

#include "cohort/comm/algorithms.h"
#include "cohort/comm/reduce.h"
#include "cohort/comm/stream_copy.h"

namespace cohort::comm {
namespace {

// When the members' buffers together (n x size) reach this, outputs bypass the caches
// (non-temporal stores). Below it the output is worth keeping cached: the next reader
// (the optimizer, the next in-place call) finds it there. 2 ranks, in place, barrier per
// call, median: 16 MiB 10.0-10.7 GB/s busbw cached vs 6.9 streamed, 64 MiB 8.0-8.5 vs
// 7.0-7.3; 4 ranks 64 MiB streamed 6.0 vs 4.9 cached.
constexpr size_t kStreamMinFootprint = size_t{192} << 20;

char* At(void* p, size_t off) { return static_cast<char*>(p) + off; }
const char* At(const void* p, size_t off) { return static_cast<const char*>(p) + off; }

// Calls body(offset, length, buffer) for each chunk of `total` units (at least one chunk,
// so that every member takes part even for empty operations).
template <typename Body>
Status ForChunks(ShmGroup& g, size_t total, size_t per_chunk, Call& c, Body body) {
  per_chunk = std::max<size_t>(per_chunk, 1);
  size_t off = 0;
  do {
    size_t len = std::min(per_chunk, total - off);
    COHORT_ASSIGN_OR_RETURN(int b, g.BeginChunk(c.desc, c.deadline));
    COHORT_RETURN_IF_ERROR(body(off, len, b));
    g.Depart();
    off += len;
  } while (off < total);
  return Status::Ok();
}

}  // namespace

Status ShmAllReduce(ShmGroup& g, const void* in, void* out, size_t count, DataType t,
                    ReduceOp op, bool direct, Call c) {
  const int n = g.size(), me = g.index();
  const size_t es = DataTypeSize(t);
  const void* srcs[64];
  std::vector<const void*> many;
  const void** s = n <= 64 ? srcs : (many.resize(n), many.data());
  const bool stream = count * es * n >= kStreamMinFootprint;
  char* scratch = nullptr;
  if (stream && direct) {
    if (c.scratch.size() < g.slot_bytes()) c.scratch.resize(g.slot_bytes());
    scratch = c.scratch.data();
  }
  auto copy_out = [&](void* dst, const void* src, size_t bytes) {
    if (stream) {
      StreamCopy(dst, src, bytes);
    } else {
      std::memcpy(dst, src, bytes);
    }
  };
  Status st = ForChunks(g, count, g.slot_bytes() / es, c, [&](size_t off, size_t len, int b) {
    std::memcpy(g.slot(me, b), At(in, off * es), len * es);
    g.Arrive(c.desc);
    COHORT_RETURN_IF_ERROR(g.WaitArrivals(c.desc, c.deadline));
    if (direct) {
      // Every member reduces everything, in rank order: one synchronization. Large outputs
      // are reduced into cache-resident scratch and streamed out.
      for (int r = 0; r < n; ++r) s[r] = g.slot(r, b);
      if (!stream) {
        ReduceMany(At(out, off * es), s, n, len, t, op, n);
        return Status::Ok();
      }
      ReduceMany(scratch, s, n, len, t, op, n);
      StreamCopy(At(out, off * es), scratch, len * es);
      return Status::Ok();
    }
    // Reduce-scatter: this member reduces its part once (own slot first: it is the
    // destination), then everyone copies every part out.
    size_t lo = len * me / n, hi = len * (me + 1) / n;
    s[0] = g.slot(me, b) + lo * es;
    for (int r = 0, k = 1; r < n; ++r) {
      if (r != me) s[k++] = g.slot(r, b) + lo * es;
    }
    ReduceMany(g.slot(me, b) + lo * es, s, n, hi - lo, t, op, n);
    g.Arrive(c.desc);
    COHORT_RETURN_IF_ERROR(g.WaitArrivals(c.desc, c.deadline));
    for (int r = 0; r < n; ++r) {
      size_t rlo = len * r / n, rhi = len * (r + 1) / n;
      copy_out(At(out, (off + rlo) * es), g.slot(r, b) + rlo * es, (rhi - rlo) * es);
    }
    return Status::Ok();
  });
  if (stream) StreamFence();
  return st;
}

Status ShmReduceScatter(ShmGroup& g, const void* in, void* out, size_t count, DataType t,
                        ReduceOp op, Call c) {
  const int n = g.size(), me = g.index();
  const size_t es = DataTypeSize(t);
  const size_t per_chunk = g.slot_bytes() / (es * n);
  std::vector<const void*> s(n);
  return ForChunks(g, count, per_chunk, c, [&](size_t off, size_t len, int b) {
    for (int q = 0; q < n; ++q) {
      std::memcpy(g.slot(me, b) + q * len * es, At(in, (q * count + off) * es), len * es);
    }
    g.Arrive(c.desc);
    COHORT_RETURN_IF_ERROR(g.WaitArrivals(c.desc, c.deadline));
    for (int r = 0; r < n; ++r) s[r] = g.slot(r, b) + me * len * es;
    ReduceMany(At(out, off * es), s.data(), n, len, t, op, n);
    return Status::Ok();
  });
}

Status ShmAllGather(ShmGroup& g, const void* in, void* out, size_t bytes, Call c) {
  const int n = g.size(), me = g.index();
  return ForChunks(g, bytes, g.slot_bytes(), c, [&](size_t off, size_t len, int b) {
    std::memcpy(g.slot(me, b), At(in, off), len);
    g.Arrive(c.desc);
    COHORT_RETURN_IF_ERROR(g.WaitArrivals(c.desc, c.deadline));
    for (int r = 0; r < n; ++r) std::memcpy(At(out, r * bytes + off), g.slot(r, b), len);
    return Status::Ok();
  });
}

Status ShmBroadcast(ShmGroup& g, void* buf, size_t bytes, int root, Call c) {
  const int me = g.index();
  return ForChunks(g, bytes, g.slot_bytes(), c, [&](size_t off, size_t len, int b) {
    if (me == root) std::memcpy(g.slot(me, b), At(buf, off), len);
    g.Arrive(c.desc);
    if (me != root) {
      COHORT_RETURN_IF_ERROR(g.WaitArrival(root, c.desc, c.deadline));
      std::memcpy(At(buf, off), g.slot(root, b), len);
    }
    return Status::Ok();
  });
}

Status ShmReduce(ShmGroup& g, const void* in, void* out, size_t count, DataType t, ReduceOp op,
                 int root, Call c) {
  const int n = g.size(), me = g.index();
  const size_t es = DataTypeSize(t);
  std::vector<const void*> s(n);
  return ForChunks(g, count, g.slot_bytes() / es, c, [&](size_t off, size_t len, int b) {
    std::memcpy(g.slot(me, b), At(in, off * es), len * es);
    g.Arrive(c.desc);
    if (me != root) return Status::Ok();
    COHORT_RETURN_IF_ERROR(g.WaitArrivals(c.desc, c.deadline));
    for (int r = 0; r < n; ++r) s[r] = g.slot(r, b);
    ReduceMany(At(out, off * es), s.data(), n, len, t, op, n);
    return Status::Ok();
  });
}

Status ShmGather(ShmGroup& g, const void* in, void* out, size_t bytes, int root, Call c) {
  const int n = g.size(), me = g.index();
  return ForChunks(g, bytes, g.slot_bytes(), c, [&](size_t off, size_t len, int b) {
    std::memcpy(g.slot(me, b), At(in, off), len);
    g.Arrive(c.desc);
    if (me != root) return Status::Ok();
    COHORT_RETURN_IF_ERROR(g.WaitArrivals(c.desc, c.deadline));
    for (int r = 0; r < n; ++r) std::memcpy(At(out, r * bytes + off), g.slot(r, b), len);
    return Status::Ok();
  });
}

Status ShmScatter(ShmGroup& g, const void* in, void* out, size_t bytes, int root, Call c) {
  const int n = g.size(), me = g.index();
  return ForChunks(g, bytes, g.slot_bytes() / n, c, [&](size_t off, size_t len, int b) {
    if (me == root) {
      for (int q = 0; q < n; ++q) std::memcpy(g.slot(me, b) + q * len, At(in, q * bytes + off), len);
    }
    g.Arrive(c.desc);
    COHORT_RETURN_IF_ERROR(g.WaitArrival(root, c.desc, c.deadline));
    std::memcpy(At(out, off), g.slot(root, b) + me * len, len);
    return Status::Ok();
  });
}

Status ShmAllToAll(ShmGroup& g, const void* in, void* out, size_t bytes, Call c) {
  const int n = g.size(), me = g.index();
  return ForChunks(g, bytes, g.slot_bytes() / n, c, [&](size_t off, size_t len, int b) {
    for (int q = 0; q < n; ++q) std::memcpy(g.slot(me, b) + q * len, At(in, q * bytes + off), len);
    g.Arrive(c.desc);
    COHORT_RETURN_IF_ERROR(g.WaitArrivals(c.desc, c.deadline));
    for (int r = 0; r < n; ++r) std::memcpy(At(out, r * bytes + off), g.slot(r, b) + me * len, len);
    return Status::Ok();
  });
}

Status ShmBarrier(ShmGroup& g, Call c) {
  return ForChunks(g, 0, 1, c, [&](size_t, size_t, int) {
    g.Arrive(c.desc);
    return g.WaitArrivals(c.desc, c.deadline);
  });
}

}  // namespace cohort::comm
