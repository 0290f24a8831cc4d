// The dense (stride 1) fast paths of ConvertElements against the scalar per-element functions,
// for F32 -> BF16 (compiler-vectorized loop) and F32 -> F16 (F16C instructions where the CPU has
// them), and every length 0..67 at every alignment to cover the vector loops' tails.
// dtype_convert_test.cc checks the scalar functions themselves against independent references.
//
// All 2^32 F32 patterns take about 30 s per run on the 2-core development machine, so by default
// (//lib/exec:dtype_convert_sampled_test) the test takes one pattern in every 64 (2^26 of them,
// at a varying offset so every low bit varies), every special class (zeros, subnormals, Inf,
// NaN payloads, the F16 range limits, and round-to-nearest ties and their neighbours at every
// mantissa bit of every exponent and sign) and 10M random patterns.
// //lib/exec:dtype_convert_all_patterns_test (tagged manual) defines RESHARD_ALL_F32_PATTERNS
// and takes every pattern.

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "lib/exec/dtype_convert.h"

namespace reshard {
namespace {

constexpr uint16_t kGuard = 0xa5a5;

// Converts patterns densely a chunk at a time and compares each with the scalar function.
class DenseChecker {
 public:
  DenseChecker(DType dst_dtype, uint16_t (*scalar)(uint32_t), const char* name)
      : dst_dtype_(dst_dtype), scalar_(scalar), name_(name) {
    src_.reserve(kChunk);
  }

  void Add(uint32_t bits) {
    src_.push_back(bits);
    if (src_.size() == kChunk) Flush();
  }

  // Checks what is pending; returns the number of patterns checked so far.
  uint64_t Finish() {
    Flush();
    EXPECT_EQ(mismatches_, 0u) << name_;
    return checked_;
  }

 private:
  static constexpr size_t kChunk = size_t{1} << 20;

  void Flush() {
    dst_.assign(src_.size(), 0);
    ConvertElements(reinterpret_cast<const std::byte*>(src_.data()), 1, DType::kF32,
                    reinterpret_cast<std::byte*>(dst_.data()), dst_dtype_,
                    static_cast<int64_t>(src_.size()));
    for (size_t i = 0; i < src_.size(); ++i) {
      const uint16_t expected = scalar_(src_[i]);
      if (dst_[i] != expected && ++mismatches_ <= 10) {
        ADD_FAILURE() << name_ << std::hex << " input 0x" << src_[i] << ": dense 0x" << dst_[i]
                      << ", scalar 0x" << expected;
      }
    }
    checked_ += src_.size();
    src_.clear();
  }

  DType dst_dtype_;
  uint16_t (*scalar_)(uint32_t);
  const char* name_;
  std::vector<uint32_t> src_;
  std::vector<uint16_t> dst_;
  uint64_t mismatches_ = 0;
  uint64_t checked_ = 0;
};

void AddSpecialClasses(DenseChecker& checker) {
  for (uint32_t bits :
       {0x00000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u,
        0x32ffffffu, 0x33800000u, 0x387fffffu, 0x38800000u, 0x38800001u, 0x477fe000u,
        0x477fefffu, 0x477ff000u, 0x477ff001u, 0x477fffffu, 0x47800000u, 0x7f7f7fffu,
        0x7f7f8000u, 0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7f802000u, 0x7f80ffffu,
        0x7fbfffffu, 0x7fc00000u, 0x7fc00001u, 0x7fffffffu}) {
    checker.Add(bits);
    checker.Add(bits | 0x80000000u);
  }
  // Every sign and exponent (zero/subnormal, normal, Inf/NaN) with, at every mantissa bit b,
  // a tie at b (result even and odd above it), one below and one above, over zero and random
  // higher mantissa bits; also the smallest and largest mantissas.
  std::mt19937 rng(17);
  for (uint32_t sign_exponent = 0; sign_exponent < 512; ++sign_exponent) {
    const uint32_t high = sign_exponent << 23;
    for (uint32_t m : {0u, 1u, 2u, 3u, 0x7ffffeu, 0x7fffffu, 0x400000u, 0x400001u}) {
      checker.Add(high | m);
    }
    for (uint32_t b = 0; b < 23; ++b) {
      const uint32_t tie = uint32_t{1} << b;
      for (int k = 0; k < 5; ++k) {
        const uint32_t above = k == 0 ? 0u : k == 1 ? (tie << 1) : rng() & ~((tie << 1) - 1u);
        for (uint32_t low : {tie - 1u, tie, tie + 1u}) {
          checker.Add(high | ((above | low) & 0x7fffffu));
        }
      }
    }
  }
}

template <typename Scalar>
void CheckDensePatterns(DType dst_dtype, Scalar scalar, const char* name) {
  DenseChecker checker(dst_dtype, scalar, name);
#ifdef RESHARD_ALL_F32_PATTERNS
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); ++bits) {
    checker.Add(static_cast<uint32_t>(bits));
  }
  EXPECT_EQ(checker.Finish(), uint64_t{1} << 32);
#else
  for (uint32_t k = 0; k < (uint32_t{1} << 26); ++k) {
    checker.Add((k << 6) | ((k * 2654435761u) >> 26));  // one in 64, offset 0..63 varying
  }
  AddSpecialClasses(checker);
  const uint32_t seed = 4711;
  std::mt19937 rng(seed);
  for (int i = 0; i < 10'000'000; ++i) checker.Add(rng());
  EXPECT_GT(checker.Finish(), uint64_t{77'000'000}) << "seed " << seed;
#endif
}

TEST(DTypeConvertDenseTest, F32ToBF16DenseMatchesScalar) {
  CheckDensePatterns(DType::kBF16, F32BitsToBF16Bits, "F32->BF16");
}

TEST(DTypeConvertDenseTest, F32ToF16DenseMatchesScalar) {
  CheckDensePatterns(DType::kF16, F32BitsToF16Bits, "F32->F16");
}

// Lengths 0..67 at source and destination byte offsets 0..3: every element converted as the
// scalar function does, and nothing written past the end.
template <typename Scalar>
void CheckTails(DType dst_dtype, Scalar scalar, const char* name) {
  std::mt19937 rng(2024);
  const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu,
                               0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x33000000u,
                               0x477ff000u, 0x38800000u, 0x3f808000u, 0x7f7f8000u};
  for (int64_t length = 0; length <= 67; ++length) {
    std::vector<uint32_t> values(static_cast<size_t>(length));
    for (auto& v : values) v = rng() % 3 == 0 ? specials[rng() % std::size(specials)] : rng();
    for (int src_offset = 0; src_offset < 4; ++src_offset) {
      for (int dst_offset = 0; dst_offset < 4; ++dst_offset) {
        std::vector<unsigned char> src(values.size() * 4 + 4);
        std::memcpy(src.data() + src_offset, values.data(), values.size() * 4);
        std::vector<unsigned char> dst(values.size() * 2 + 4 + 2);
        std::memset(dst.data(), 0xa5, dst.size());
        ConvertElements(reinterpret_cast<const std::byte*>(src.data() + src_offset), 1, DType::kF32,
                        reinterpret_cast<std::byte*>(dst.data() + dst_offset), dst_dtype, length);
        for (int i = 0; i < dst_offset; ++i) ASSERT_EQ(dst[i], 0xa5) << name << " wrote before";
        for (int64_t i = 0; i < length; ++i) {
          uint16_t got;
          std::memcpy(&got, dst.data() + dst_offset + i * 2, 2);
          ASSERT_EQ(got, scalar(values[i])) << name << " length " << length << " element " << i
                                            << std::hex << " input 0x" << values[i];
        }
        uint16_t guard;
        std::memcpy(&guard, dst.data() + dst_offset + length * 2, 2);
        ASSERT_EQ(guard, kGuard) << name << " wrote past length " << length;
      }
    }
  }
}

TEST(DTypeConvertDenseTest, F32ToBF16Tails) { CheckTails(DType::kBF16, F32BitsToBF16Bits, "BF16"); }

TEST(DTypeConvertDenseTest, F32ToF16Tails) { CheckTails(DType::kF16, F32BitsToF16Bits, "F16"); }

}  // namespace
}  // namespace reshard
