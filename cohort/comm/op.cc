// OpDesc formatting. Pure functions.
#include "cohort/comm/op.h"

#include <fmt/format.h>

namespace cohort::comm {

std::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce: return "allreduce";
    case OpKind::kReduceScatter: return "reducescatter";
    case OpKind::kAllGather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kAllToAll: return "alltoall";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kSend: return "send/recv";
  }
  return "?";
}

std::string OpDesc::ToString() const {
  std::string text = fmt::format("{} #{} ({} {}, {} element(s)", OpKindName(kind), seq,
                                 DataTypeName(dtype), ReduceOpName(op), count);
  if (kind == OpKind::kSend) {
    text += fmt::format(", tag {}", root);
  } else if (root >= 0) {
    text += fmt::format(", root {}", root);
  }
  return text + ")";
}

}  // namespace cohort::comm
