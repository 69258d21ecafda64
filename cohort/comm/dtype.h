// Element types and reduction operators of libcohort collectives.
// Thread-safety: constants and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cohort/base/status.h"

namespace cohort::comm {

enum class DataType : uint8_t { kF32, kF64, kF16, kBF16, kI8, kU8, kI32, kI64 };
enum class ReduceOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };

inline constexpr DataType kAllDataTypes[] = {DataType::kF32, DataType::kF64, DataType::kF16,
                                             DataType::kBF16, DataType::kI8,  DataType::kU8,
                                             DataType::kI32, DataType::kI64};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kAvg};

inline size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kF64:
    case DataType::kI64: return 8;
    case DataType::kF32:
    case DataType::kI32: return 4;
    case DataType::kF16:
    case DataType::kBF16: return 2;
    case DataType::kI8:
    case DataType::kU8: return 1;
  }
  return 1;
}

inline bool IsFloating(DataType t) {
  return t == DataType::kF32 || t == DataType::kF64 || t == DataType::kF16 ||
         t == DataType::kBF16;
}

// Names as nccl-tests prints them.
std::string_view DataTypeName(DataType t);
std::string_view ReduceOpName(ReduceOp op);
Result<DataType> ParseDataType(std::string_view name);
Result<ReduceOp> ParseReduceOp(std::string_view name);

// kAvg is defined for floating types only.
inline Status CheckOp(DataType t, ReduceOp op) {
  if (op == ReduceOp::kAvg && !IsFloating(t)) {
    return InvalidArgument("avg is defined for floating types only, not {}", DataTypeName(t));
  }
  return Status::Ok();
}

// Half-precision conversions (round to nearest even), exact for every value.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Element i of a typed buffer as a double, and back (integers wrap, halves round to
// nearest even). For tests, checks and benchmarks, not hot paths.
double GetElement(const void* buf, size_t i, DataType t);
void SetElement(void* buf, size_t i, DataType t, double v);

}  // namespace cohort::comm
