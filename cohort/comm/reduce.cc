// Runtime dispatch of the reduction kernels and the dtype helpers. Thread-safety: the
// kernel table is chosen once (static initialization is thread-safe).
#include "cohort/comm/reduce.h"

#include <bit>
#include <cstdlib>

#include "cohort/base/settings.h"
#include "cohort/base/strings.h"

namespace cohort::comm {

#define COHORT_DECLARE_KERNELS(ns)                                                       \
  namespace ns {                                                                         \
  void ReduceMany(void*, const void* const*, int, size_t, DataType, ReduceOp, int);      \
  void ReduceInto(void*, const void*, size_t, DataType, ReduceOp);                       \
  void FinishAvg(void*, size_t, DataType, int);                                          \
  }
COHORT_DECLARE_KERNELS(generic)
COHORT_DECLARE_KERNELS(avx2)
COHORT_DECLARE_KERNELS(avx512)
#undef COHORT_DECLARE_KERNELS

namespace {

struct Kernels {
  std::string_view name;
  void (*many)(void*, const void* const*, int, size_t, DataType, ReduceOp, int);
  void (*into)(void*, const void*, size_t, DataType, ReduceOp);
  void (*finish_avg)(void*, size_t, DataType, int);
};

Kernels Choose() {
  __builtin_cpu_init();
  const std::string& want = settings::kReduceKernel.Get();
  bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
  bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("f16c");
  if ((want.empty() || want == "avx512") && has512) {
    return {"avx512", avx512::ReduceMany, avx512::ReduceInto, avx512::FinishAvg};
  }
  if ((want.empty() || want == "avx2" || want == "avx512") && has2) {
    return {"avx2", avx2::ReduceMany, avx2::ReduceInto, avx2::FinishAvg};
  }
  return {"generic", generic::ReduceMany, generic::ReduceInto, generic::FinishAvg};
}

const Kernels& K() {
  static const Kernels kernels = Choose();
  return kernels;
}

}  // namespace

void ReduceMany(void* dst, const void* const* srcs, int n, size_t count, DataType type,
                ReduceOp op, int avg_divisor) {
  K().many(dst, srcs, n, count, type, op, avg_divisor);
}
void ReduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op) {
  K().into(dst, src, count, type, op);
}
void FinishAvg(void* dst, size_t count, DataType type, int divisor) {
  K().finish_avg(dst, count, type, divisor);
}
std::string_view ReduceKernelName() { return K().name; }

std::string_view DataTypeName(DataType t) {
  switch (t) {
    case DataType::kF32: return "float";
    case DataType::kF64: return "double";
    case DataType::kF16: return "half";
    case DataType::kBF16: return "bfloat16";
    case DataType::kI8: return "int8";
    case DataType::kU8: return "uint8";
    case DataType::kI32: return "int32";
    case DataType::kI64: return "int64";
  }
  return "?";
}

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

Result<DataType> ParseDataType(std::string_view name) {
  std::string n = ToLower(name);
  if (n == "float" || n == "f32" || n == "float32") return DataType::kF32;
  if (n == "double" || n == "f64" || n == "float64") return DataType::kF64;
  if (n == "half" || n == "f16" || n == "float16") return DataType::kF16;
  if (n == "bfloat16" || n == "bf16") return DataType::kBF16;
  if (n == "int8" || n == "i8") return DataType::kI8;
  if (n == "uint8" || n == "u8") return DataType::kU8;
  if (n == "int32" || n == "int" || n == "i32") return DataType::kI32;
  if (n == "int64" || n == "i64") return DataType::kI64;
  return InvalidArgument(
      "unknown data type '{}' (float, double, half, bfloat16, int8, uint8, int32, int64)", name);
}

Result<ReduceOp> ParseReduceOp(std::string_view name) {
  std::string n = ToLower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "prod") return ReduceOp::kProd;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "avg") return ReduceOp::kAvg;
  return InvalidArgument("unknown reduction '{}' (sum, prod, min, max, avg)", name);
}

double GetElement(const void* buf, size_t i, DataType t) {
  switch (t) {
    case DataType::kF32: return static_cast<const float*>(buf)[i];
    case DataType::kF64: return static_cast<const double*>(buf)[i];
    case DataType::kF16: return HalfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBF16: return BFloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kI8: return static_cast<const int8_t*>(buf)[i];
    case DataType::kU8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kI32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kI64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
  }
  return 0;
}

void SetElement(void* buf, size_t i, DataType t, double v) {
  const int64_t w = static_cast<int64_t>(v);  // integers wrap like the kernels do
  switch (t) {
    case DataType::kF32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DataType::kF64: static_cast<double*>(buf)[i] = v; break;
    case DataType::kF16: static_cast<uint16_t*>(buf)[i] = FloatToHalf(static_cast<float>(v)); break;
    case DataType::kBF16:
      static_cast<uint16_t*>(buf)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    case DataType::kI8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(w); break;
    case DataType::kU8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(w); break;
    case DataType::kI32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(w); break;
    case DataType::kI64: static_cast<int64_t*>(buf)[i] = w; break;
  }
}

float HalfToFloat(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
uint16_t FloatToHalf(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }

}  // namespace cohort::comm
