#include "lib/exec/dtype_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace {

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool IsF16NaN(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
bool IsBF16NaN(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }
bool IsF32NaN(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }

// Independent F16 decoding: the value of finite bit patterns as a double.
double F16Value(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(static_cast<double>(mantissa), -24);
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  return sign * std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
}

// Reference rounding of a finite float to F16, round to nearest, ties to even, by comparing
// distances to the two neighbouring F16 values. 0x7c00 counts as 2^16 (IEEE overflow rule).
uint16_t ReferenceF32ToF16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  auto magnitude_value = [](uint16_t m) { return m == 0x7c00 ? 65536.0 : F16Value(m); };
  if (a >= 65536.0) return sign | 0x7c00;
  // Largest m with value(m) <= a.
  uint16_t lo = 0, hi = 0x7c00;
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (magnitude_value(mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  if (magnitude_value(lo) == a) return sign | lo;
  const double down = a - magnitude_value(lo);
  const double up = magnitude_value(hi) - a;
  if (down < up) return sign | lo;
  if (up < down) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

// Reference rounding of a finite float to BF16 by distances; 0x7f80 counts as 2^128.
uint16_t ReferenceF32ToBF16(uint32_t bits) {
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffffu;
  const uint16_t lo = static_cast<uint16_t>(magnitude >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  auto value = [](uint16_t m) {
    return m == 0x7f80 ? std::ldexp(1.0, 128) : static_cast<double>(BitsFloat(uint32_t{m} << 16));
  };
  if (magnitude == 0x7f800000u) return sign | 0x7f80;
  const double a = BitsFloat(magnitude);
  if (value(lo) == a) return sign | lo;
  const double down = a - value(lo);
  const double up = value(hi) - a;
  if (down < up) return sign | lo;
  if (up < down) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

TEST(DTypeConvertTest, F16ToF32AllInputs) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint32_t got = F16BitsToF32Bits(h);
    if (IsF16NaN(h)) {
      EXPECT_TRUE(IsF32NaN(got)) << std::hex << "h=0x" << i << " got 0x" << got;
      EXPECT_EQ(got >> 31, uint32_t{h} >> 15) << std::hex << "sign of NaN 0x" << i;
      // Quiet, payload kept: what the F16C instruction (the dense path) produces.
      EXPECT_EQ((got >> 13) & 0x3ffu, (h & 0x3ffu) | 0x200u) << std::hex << "NaN 0x" << i;
      continue;
    }
    const float expected = static_cast<float>(F16Value(h));
    ASSERT_EQ(got, FloatBits(expected)) << std::hex << "h=0x" << i;
  }
}

TEST(DTypeConvertTest, F32ToF16RoundTripsEveryF16) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    if (IsF16NaN(h)) continue;
    const float f = static_cast<float>(F16Value(h));
    ASSERT_EQ(F32BitsToF16Bits(FloatBits(f)), h) << std::hex << "h=0x" << i;
  }
}

TEST(DTypeConvertTest, F32ToF16MidpointsTieToEven) {
  for (uint32_t i = 0; i < 0x7c00; ++i) {  // every pair of consecutive finite magnitudes
    for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const uint16_t lo = static_cast<uint16_t>(sign | i);
      const uint16_t hi = static_cast<uint16_t>(sign | (i + 1));
      const double a = std::fabs(F16Value(lo));
      const double b = (i + 1 == 0x7c00) ? 65536.0 : std::fabs(F16Value(hi));
      const double mid_magnitude = (a + b) / 2;
      const float mid = static_cast<float>(sign ? -mid_magnitude : mid_magnitude);
      ASSERT_EQ(static_cast<double>(std::fabs(mid)), mid_magnitude) << "midpoint not exact";
      const uint16_t even = (i & 1) ? hi : lo;
      ASSERT_EQ(F32BitsToF16Bits(FloatBits(mid)), even)
          << std::hex << "between 0x" << lo << " and 0x" << hi;
      // One float ulp either side of the midpoint decides without a tie.
      const float above = std::nextafter(mid, sign ? -INFINITY : INFINITY);
      const float below = std::nextafter(mid, 0.0f);
      ASSERT_EQ(F32BitsToF16Bits(FloatBits(above)), hi) << std::hex << "above mid 0x" << lo;
      ASSERT_EQ(F32BitsToF16Bits(FloatBits(below)), lo) << std::hex << "below mid 0x" << lo;
    }
  }
}

TEST(DTypeConvertTest, F32ToF16Overflow) {
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(65504.0f)), 0x7bff);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(65519.99f)), 0x7bff);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(65520.0f)), 0x7c00);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(-65520.0f)), 0xfc00);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(1e10f)), 0x7c00);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::numeric_limits<float>::max())), 0x7c00);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(INFINITY)), 0x7c00);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(-INFINITY)), 0xfc00);
}

TEST(DTypeConvertTest, F32ToF16Subnormals) {
  const float tiny = std::ldexp(1.0f, -25);  // half the smallest subnormal: a tie, to zero
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(tiny)), 0x0000);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(-tiny)), 0x8000);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::nextafter(tiny, 1.0f))), 0x0001);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(-std::nextafter(tiny, 1.0f))), 0x8001);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::nextafter(tiny, 0.0f))), 0x0000);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::ldexp(1.0f, -24))), 0x0001);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::ldexp(3.0f, -25))), 0x0002);  // 1.5: tie to even
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::ldexp(1.0f, -14))), 0x0400);  // smallest normal
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::nextafter(std::ldexp(1.0f, -14), 0.0f))), 0x0400);
  EXPECT_EQ(F32BitsToF16Bits(FloatBits(std::numeric_limits<float>::denorm_min())), 0x0000);
  EXPECT_EQ(F32BitsToF16Bits(0x80000000u), 0x8000);
}

TEST(DTypeConvertTest, F32ToF16NaN) {
  for (uint32_t bits :
       {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f802000u, 0xffc00001u}) {
    const uint16_t h = F32BitsToF16Bits(bits);
    EXPECT_TRUE(IsF16NaN(h)) << std::hex << bits;
    EXPECT_TRUE(h & 0x0200) << "not quiet: " << std::hex << bits;
    EXPECT_EQ(h >> 15, bits >> 31);
  }
}

TEST(DTypeConvertTest, F32ToF16MatchesReferenceOnRandomInputs) {
  const uint32_t seed = 4242;
  std::mt19937 rng(seed);
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t bits = rng();
    // Concentrate half the inputs on the F16 range (exponents 100..143).
    if (i % 2 == 0) bits = (bits & 0x807fffffu) | ((100u + rng() % 44u) << 23);
    if (IsF32NaN(bits)) continue;
    ASSERT_EQ(F32BitsToF16Bits(bits), ReferenceF32ToF16(BitsFloat(bits)))
        << "seed " << seed << " i " << i << std::hex << " bits 0x" << bits;
  }
}

TEST(DTypeConvertTest, F32ToBF16) {
  EXPECT_EQ(F32BitsToBF16Bits(0x3f800000u), 0x3f80);
  EXPECT_EQ(F32BitsToBF16Bits(0x3f808000u), 0x3f80);  // tie, lower is even
  EXPECT_EQ(F32BitsToBF16Bits(0x3f818000u), 0x3f82);  // tie, upper is even
  EXPECT_EQ(F32BitsToBF16Bits(0x3f808001u), 0x3f81);
  EXPECT_EQ(F32BitsToBF16Bits(0x3f807fffu), 0x3f80);
  EXPECT_EQ(F32BitsToBF16Bits(0xbf818000u), 0xbf82);
  EXPECT_EQ(F32BitsToBF16Bits(0x7f800000u), 0x7f80);  // Inf
  EXPECT_EQ(F32BitsToBF16Bits(0xff800000u), 0xff80);
  EXPECT_EQ(F32BitsToBF16Bits(0x7f7fffffu), 0x7f80);  // max finite rounds to Inf
  EXPECT_EQ(F32BitsToBF16Bits(0x7f7f7fffu), 0x7f7f);
  EXPECT_EQ(F32BitsToBF16Bits(0x7f7f8000u), 0x7f80);  // tie at the top: to even = Inf
  EXPECT_EQ(F32BitsToBF16Bits(0x00000001u), 0x0000);
  EXPECT_EQ(F32BitsToBF16Bits(0x80000000u), 0x8000);
  for (uint32_t nan :
       {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu, 0xffbfffffu}) {
    const uint16_t b = F32BitsToBF16Bits(nan);
    EXPECT_TRUE(IsBF16NaN(b)) << std::hex << nan << " -> " << b;
    EXPECT_TRUE(b & 0x0040) << "not quiet: " << std::hex << nan;
    EXPECT_EQ(b >> 15, nan >> 31);
  }
}

TEST(DTypeConvertTest, F32ToBF16MatchesReferenceOnRandomInputs) {
  const uint32_t seed = 99;
  std::mt19937 rng(seed);
  for (int i = 0; i < 1'000'000; ++i) {
    uint32_t bits = rng();
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u | (rng() & 1u);  // near ties
    if (IsF32NaN(bits)) continue;
    ASSERT_EQ(F32BitsToBF16Bits(bits), ReferenceF32ToBF16(bits))
        << "seed " << seed << " i " << i << std::hex << " bits 0x" << bits;
  }
}

TEST(DTypeConvertTest, BF16ToF32) {
  EXPECT_EQ(BF16BitsToF32Bits(0x3f80), 0x3f800000u);
  EXPECT_EQ(BF16BitsToF32Bits(0xff80), 0xff800000u);
  for (uint32_t b = 0; b < 65536; ++b) {
    if (IsBF16NaN(static_cast<uint16_t>(b))) continue;
    ASSERT_EQ(F32BitsToBF16Bits(BF16BitsToF32Bits(static_cast<uint16_t>(b))), b);
  }
}

// Random F32 bit patterns with NaN, Inf, zeros, subnormals and F16-range values mixed in.
std::vector<uint32_t> RandomF32Bits(uint32_t seed, size_t count) {
  std::mt19937 rng(seed);
  const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu,
                               0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x33000000u,
                               0x33000001u, 0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu};
  std::vector<uint32_t> values(count);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = rng();
    switch (i % 5) {
      case 0:
        values[i] = specials[r % std::size(specials)];
        break;
      case 1:
        values[i] = (r & 0x807fffffu) | ((100u + rng() % 44u) << 23);
        break;
      case 2:
        values[i] = (r & 0x807fffffu) | 0x7f800000u;
        break;  // Inf or NaN
      case 3:
        values[i] = r & 0x807fffffu;
        break;  // subnormal or zero
      default:
        values[i] = r;
        break;
    }
  }
  std::shuffle(values.begin(), values.end(), rng);
  return values;
}

// Converts `values` (of `src` dtype, given as raw bytes) densely and with stride 2 through an
// interleaved buffer, and checks both agree with each other and with `scalar`.
template <typename From, typename To, typename Scalar>
void CheckDenseMatchesStrided(const std::vector<From>& values, DType src, DType dst, Scalar scalar,
                              const std::string& context) {
  const size_t n = values.size();
  std::vector<From> interleaved(2 * n);
  for (size_t i = 0; i < n; ++i) {
    interleaved[2 * i] = values[i];
    interleaved[2 * i + 1] = static_cast<From>(0x5a5a5a5au);
  }
  std::vector<To> dense(n), strided(n);
  ConvertElements(reinterpret_cast<const std::byte*>(values.data()), 1, src,
                  reinterpret_cast<std::byte*>(dense.data()), dst, static_cast<int64_t>(n));
  ConvertElements(reinterpret_cast<const std::byte*>(interleaved.data()), 2, src,
                  reinterpret_cast<std::byte*>(strided.data()), dst, static_cast<int64_t>(n));
  // Unaligned, odd-length dense run too (hardware loop plus scalar tail).
  std::vector<unsigned char> unaligned_src(n * sizeof(From) + 1);
  std::memcpy(unaligned_src.data() + 1, values.data(), n * sizeof(From));
  std::vector<unsigned char> unaligned_dst((n - 3) * sizeof(To) + 1);
  ConvertElements(reinterpret_cast<const std::byte*>(unaligned_src.data() + 1), 1, src,
                  reinterpret_cast<std::byte*>(unaligned_dst.data() + 1), dst,
                  static_cast<int64_t>(n - 3));
  for (size_t i = 0; i < n; ++i) {
    const To expected = scalar(values[i]);
    ASSERT_EQ(dense[i], strided[i]) << context << std::hex << " input 0x" << +values[i]
                                    << ": dense 0x" << +dense[i] << " strided 0x" << +strided[i];
    ASSERT_EQ(dense[i], expected) << context << std::hex << " input 0x" << +values[i];
    if (i < n - 3) {
      To u;
      std::memcpy(&u, unaligned_dst.data() + 1 + i * sizeof(To), sizeof(To));
      ASSERT_EQ(u, expected) << context << " unaligned" << std::hex << " input 0x" << +values[i];
    }
  }
}

TEST(ConvertElementsTest, DenseAndStridedAgreeF32ToF16) {
  const uint32_t seed = 31337;
  const auto values = RandomF32Bits(seed, 1'000'003);
  CheckDenseMatchesStrided<uint32_t, uint16_t>(values, DType::kF32, DType::kF16, F32BitsToF16Bits,
                                               "F32->F16 seed " + std::to_string(seed));
}

TEST(ConvertElementsTest, DenseAndStridedAgreeF32ToBF16) {
  const uint32_t seed = 31338;
  const auto values = RandomF32Bits(seed, 200'003);
  CheckDenseMatchesStrided<uint32_t, uint16_t>(values, DType::kF32, DType::kBF16, F32BitsToBF16Bits,
                                               "F32->BF16 seed " + std::to_string(seed));
}

std::vector<uint16_t> AllF16BitsShuffled(uint32_t seed) {
  std::vector<uint16_t> values(65536 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint16_t>(i);
  std::shuffle(values.begin(), values.end(), std::mt19937(seed));
  return values;
}

TEST(ConvertElementsTest, DenseAndStridedAgreeF16ToF32) {
  // Every F16 pattern, NaNs with payloads included: the hardware (dense) and software (strided)
  // paths must produce identical bits.
  const uint32_t seed = 5;
  CheckDenseMatchesStrided<uint16_t, uint32_t>(AllF16BitsShuffled(seed), DType::kF16, DType::kF32,
                                               F16BitsToF32Bits,
                                               "F16->F32 seed " + std::to_string(seed));
}

TEST(ConvertElementsTest, DenseAndStridedAgreeBetween16BitTypes) {
  const uint32_t seed = 6;
  const auto values = AllF16BitsShuffled(seed);
  CheckDenseMatchesStrided<uint16_t, uint32_t>(values, DType::kBF16, DType::kF32, BF16BitsToF32Bits,
                                               "BF16->F32");
  CheckDenseMatchesStrided<uint16_t, uint16_t>(
      values, DType::kBF16, DType::kF16,
      [](uint16_t b) { return F32BitsToF16Bits(BF16BitsToF32Bits(b)); }, "BF16->F16");
  CheckDenseMatchesStrided<uint16_t, uint16_t>(
      values, DType::kF16, DType::kBF16,
      [](uint16_t h) { return F32BitsToBF16Bits(F16BitsToF32Bits(h)); }, "F16->BF16");
}

TEST(ConvertElementsTest, SameDTypeCopies) {
  std::vector<uint64_t> src = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<uint64_t> dst(3, 0);
  ConvertElements(reinterpret_cast<const std::byte*>(src.data()), 3, DType::kI64,
                  reinterpret_cast<std::byte*>(dst.data()), DType::kI64, 3);
  EXPECT_EQ(dst, (std::vector<uint64_t>{1, 4, 7}));
  std::vector<uint8_t> bytes = {9, 8, 7, 6};
  std::vector<uint8_t> out(4, 0);
  ConvertElements(reinterpret_cast<const std::byte*>(bytes.data()), 1, DType::kBool,
                  reinterpret_cast<std::byte*>(out.data()), DType::kBool, 4);
  EXPECT_EQ(out, bytes);
  // count 0 writes nothing.
  ConvertElements(reinterpret_cast<const std::byte*>(bytes.data()), 1, DType::kF32,
                  reinterpret_cast<std::byte*>(out.data()), DType::kF16, 0);
  EXPECT_EQ(out, bytes);
}

}  // namespace
}  // namespace reshard
