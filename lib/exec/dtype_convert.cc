#include "lib/exec/dtype_convert.h"

#include <immintrin.h>

#include <cstring>

namespace reshard {
namespace {

template <typename T>
T Load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T>
void Store(std::byte* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}

// Per-element conversions. The exported F32BitsTo*Bits / F16BitsToF32Bits wrap these: in a
// -fPIC build (fastbuild, tests) GCC may not inline an exported function into the loops below
// (it could be interposed), and a call per element keeps the dense loop scalar.
inline uint16_t BF16FromF32(uint32_t bits) {
  // Round to nearest even; NaN made quiet with sign and top payload bits kept. Written as a
  // select, not a branch, so the dense loop vectorizes.
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline uint16_t F16FromF32(uint32_t bits) {
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // Inf or NaN
    if (magnitude > 0x7f800000u) {
      return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x03ffu));
    }
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: Inf
  if (magnitude < 0x38800000u) {                // below 2^-14: F16 subnormal or zero
    if (magnitude <= 0x33000000u) return sign;  // <= 2^-25 rounds to zero (2^-25 is a tie)
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (remainder > half || (remainder == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = (magnitude >> 13) - (112u << 10);  // rebias exponent 127 -> 15
  const uint32_t remainder = magnitude & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline uint32_t F32FromF16(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return sign;
    exponent = 113;  // normalize the subnormal
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    return sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  if (exponent == 31) {
    // Inf, or NaN made quiet as the F16C instruction does, so strided (software) and dense
    // (hardware) conversions give identical bits.
    return mantissa == 0 ? sign | 0x7f800000u : sign | 0x7fc00000u | (mantissa << 13);
  }
  return sign | ((exponent + 112u) << 23) | (mantissa << 13);
}

// Applies `fn` to every element. The dense case has its own loop (no stride arithmetic), which
// the compiler vectorizes when `fn` is branch-free: F32 -> BF16 with SSE2 at this library's
// -O3 (dtype_convert_benchmark shows whether it did). The strided loop stays scalar.
template <typename From, typename To, typename Fn>
void Map(const std::byte* src, int64_t stride, std::byte* dst, int64_t count, Fn fn) {
  if (stride == 1) {
    for (int64_t i = 0; i < count; ++i) {
      Store<To>(dst + i * sizeof(To), fn(Load<From>(src + i * sizeof(From))));
    }
    return;
  }
  const int64_t step = stride * static_cast<int64_t>(sizeof(From));
  for (int64_t i = 0; i < count; ++i) {
    Store<To>(dst + i * sizeof(To), fn(Load<From>(src + i * step)));
  }
}

#if defined(__x86_64__)
// Hardware F16C conversions (round to nearest even, NaN quieted like the software path).
__attribute__((target("avx,f16c"))) void F32ToF16Hardware(const std::byte* src, std::byte* dst,
                                                          int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(src + i * 4));
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * 2), h);
  }
  for (; i < count; ++i) Store<uint16_t>(dst + i * 2, F16FromF32(Load<uint32_t>(src + i * 4)));
}

__attribute__((target("avx,f16c"))) void F16ToF32Hardware(const std::byte* src, std::byte* dst,
                                                          int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * 2));
    _mm256_storeu_ps(reinterpret_cast<float*>(dst + i * 4), _mm256_cvtph_ps(h));
  }
  for (; i < count; ++i) Store<uint32_t>(dst + i * 4, F32FromF16(Load<uint16_t>(src + i * 2)));
}

bool HasF16C() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}
#else
bool HasF16C() { return false; }
void F32ToF16Hardware(const std::byte*, std::byte*, int64_t) {}
void F16ToF32Hardware(const std::byte*, std::byte*, int64_t) {}
#endif

void CopyStrided(const std::byte* src, int64_t stride, std::byte* dst, size_t element_size,
                 int64_t count) {
  if (stride == 1) {
    std::memcpy(dst, src, static_cast<size_t>(count) * element_size);
    return;
  }
  const int64_t step = stride * static_cast<int64_t>(element_size);
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(dst + i * element_size, src + i * step, element_size);
  }
}

}  // namespace

uint16_t F32BitsToBF16Bits(uint32_t bits) { return BF16FromF32(bits); }
uint16_t F32BitsToF16Bits(uint32_t bits) { return F16FromF32(bits); }
uint32_t F16BitsToF32Bits(uint16_t bits) { return F32FromF16(bits); }

void ConvertElements(const std::byte* src, int64_t src_stride, DType src_dtype, std::byte* dst,
                     DType dst_dtype, int64_t count) {
  if (count <= 0) return;
  if (src_dtype == dst_dtype) {
    CopyStrided(src, src_stride, dst, DTypeSize(src_dtype), count);
    return;
  }
  const bool dense = src_stride == 1;
  switch (src_dtype) {
    case DType::kF32:
      if (dst_dtype == DType::kBF16) {
        Map<uint32_t, uint16_t>(src, src_stride, dst, count, BF16FromF32);
      } else if (dense && HasF16C()) {
        F32ToF16Hardware(src, dst, count);
      } else {
        Map<uint32_t, uint16_t>(src, src_stride, dst, count, F16FromF32);
      }
      return;
    case DType::kBF16:
      if (dst_dtype == DType::kF32) {
        Map<uint16_t, uint32_t>(src, src_stride, dst, count, BF16BitsToF32Bits);
      } else {
        Map<uint16_t, uint16_t>(src, src_stride, dst, count,
                                [](uint16_t b) { return F16FromF32(BF16BitsToF32Bits(b)); });
      }
      return;
    case DType::kF16:
      if (dst_dtype == DType::kF32) {
        if (dense && HasF16C()) {
          F16ToF32Hardware(src, dst, count);
        } else {
          Map<uint16_t, uint32_t>(src, src_stride, dst, count, F32FromF16);
        }
      } else {
        Map<uint16_t, uint16_t>(src, src_stride, dst, count,
                                [](uint16_t b) { return BF16FromF32(F32FromF16(b)); });
      }
      return;
    default:
      return;  // unreachable: the planner only admits float conversions
  }
}

}  // namespace reshard
