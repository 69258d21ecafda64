// OpDesc: what a rank believes the current operation is. Transports carry it with the data
// so that ranks that issued different collectives (order, kind, type or size) get an error
// naming both sides instead of a hang or garbage. Thread-safety: value type.
#pragma once

#include <cstdint>
#include <string>

#include "cohort/comm/dtype.h"

namespace cohort::comm {

enum class OpKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kGather,
  kScatter,
  kAllToAll,
  kBarrier,
  kSend,  // point-to-point; seq counts messages of one (sender, receiver) pair
};

std::string_view OpKindName(OpKind kind);

struct OpDesc {
  uint32_t seq = 0;
  OpKind kind = OpKind::kBarrier;
  DataType dtype = DataType::kU8;
  ReduceOp op = ReduceOp::kSum;
  uint8_t reserved = 0;
  int32_t root = -1;  // root rank, or the tag of a send
  uint64_t count = 0;

  bool operator==(const OpDesc& o) const {
    return seq == o.seq && kind == o.kind && dtype == o.dtype && op == o.op && root == o.root &&
           count == o.count;
  }
  // "allreduce #12 (float sum, 1024 elements)"
  std::string ToString() const;
};
static_assert(sizeof(OpDesc) == 24, "OpDesc is sent as raw bytes");

}  // namespace cohort::comm
