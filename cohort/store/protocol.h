// The cohort store wire protocol (documented in docs/store-protocol.md): opcodes, the
// handshake constants and limits shared by TcpStore (client) and StoreServer.
//
// Thread-safety: constants only.
#pragma once

#include <cstdint>
#include <string_view>

namespace cohort::store::protocol {

inline constexpr std::string_view kMagic = "cohort-store";
// 2: BEAT waits for any of a list of keys; WILL.
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kDefaultMaxFrame = 64u << 20;  // 64 MiB
// The largest frame a client may send before it has authenticated (HELLO: magic, version
// and token): a stranger cannot make the server allocate more than this per connection.
inline constexpr uint32_t kMaxHelloFrame = 4u << 10;
// The longest wait a GET/WAIT/MULTI_GET may ask for (longer ones are capped); -1: none.
inline constexpr int64_t kMaxWaitMs = int64_t{30} * 24 * 3600 * 1000;
inline constexpr uint32_t kMaxKeysPerRequest = 1u << 20;

enum class Op : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kWait = 6,
  kCheck = 7,
  kDelete = 8,
  kNumKeys = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kPing = 12,
  kPeek = 13,
  kBeat = 14,
  kAppend = 15,
  kWill = 16,
  kCreateAll = 17,
};

inline std::string_view OpName(Op op) {
  switch (op) {
    case Op::kHello: return "HELLO";
    case Op::kSet: return "SET";
    case Op::kGet: return "GET";
    case Op::kAdd: return "ADD";
    case Op::kCompareSet: return "COMPARE_SET";
    case Op::kWait: return "WAIT";
    case Op::kCheck: return "CHECK";
    case Op::kDelete: return "DELETE";
    case Op::kNumKeys: return "NUM_KEYS";
    case Op::kMultiGet: return "MULTI_GET";
    case Op::kMultiSet: return "MULTI_SET";
    case Op::kPing: return "PING";
    case Op::kPeek: return "PEEK";
    case Op::kBeat: return "BEAT";
    case Op::kAppend: return "APPEND";
    case Op::kWill: return "WILL";
    case Op::kCreateAll: return "CREATE_ALL";
  }
  return "UNKNOWN";
}

}  // namespace cohort::store::protocol
