// Reduction kernels: every type x op against a scalar reference, on every instruction set
// this machine supports, including half types (accumulated in f32) and odd lengths.
#include "cohort/comm/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace cohort::comm {
namespace {

TEST(HalfTest, RoundTripsAndRounding) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.5f)), 1.5f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.f)), 65504.f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(3.0f)), 3.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.00390625f)), 1.0f);  // ties to even
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
}

TEST(ReduceTest, HalfAccumulatesInFloat) {
  // 2048 + 1 + 1 in f16 pairwise would lose both ones (spacing 2 at 2048); in f32 it is 2050.
  std::vector<uint16_t> a{FloatToHalf(2048.f)}, b{FloatToHalf(1.f)}, c{FloatToHalf(1.f)};
  uint16_t out;
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  ReduceMany(&out, srcs, 3, 1, DataType::kF16, ReduceOp::kSum, 1);
  EXPECT_EQ(HalfToFloat(out), 2050.f);
}

TEST(ReduceTest, KernelIsChosen) {
  std::string name(ReduceKernelName());
  EXPECT_TRUE(name == "avx512" || name == "avx2" || name == "generic") << name;
}

}  // namespace
}  // namespace cohort::comm
