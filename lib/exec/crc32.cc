#include "lib/exec/crc32.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace reshard {
namespace {

uint32_t ZlibCrc32(uint32_t crc, const unsigned char* data, size_t length) {
  return static_cast<uint32_t>(::crc32_z(crc, data, static_cast<z_size_t>(length)));
}

#if defined(__x86_64__)

#define RESHARD_PCLMUL __attribute__((target("pclmul,sse4.1")))

RESHARD_PCLMUL inline __m128i Load(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// `x` multiplied by the power of x in `k` (its two 64-bit halves by k's) plus `next`.
RESHARD_PCLMUL inline __m128i Fold(__m128i k, __m128i x, __m128i next) {
  const __m128i low = _mm_clmulepi64_si128(x, k, 0x00);
  const __m128i high = _mm_clmulepi64_si128(x, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(high, low), next);
}

// Folds `length` bytes (a multiple of 16, at least 64) into `crc`, which is taken and returned
// in the inverted form the folding works on (~ of zlib's value).
RESHARD_PCLMUL uint32_t FoldPclmul(const unsigned char* data, size_t length, uint32_t crc) {
  // Bit-reflected constants x^(4*128+32) mod P, x^(4*128-32) mod P (4-way fold),
  // x^(128+32), x^(128-32) (1-way fold), x^64 mod P, and P' / P for the Barrett reduction.
  alignas(16) static const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};
  alignas(16) static const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};
  // Four 128-bit accumulators over the first 64 bytes, the CRC folded into the first.
  __m128i x1 = _mm_xor_si128(Load(data), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = Load(data + 16);
  __m128i x3 = Load(data + 32);
  __m128i x4 = Load(data + 48);
  data += 64;
  length -= 64;
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  // Folding by 64 bytes: each accumulator times x^512 (mod P, split into its two halves)
  // plus the next 16 bytes of its lane.
  while (length >= 64) {
    x1 = Fold(k, x1, Load(data));
    x2 = Fold(k, x2, Load(data + 16));
    x3 = Fold(k, x3, Load(data + 32));
    x4 = Fold(k, x4, Load(data + 48));
    data += 64;
    length -= 64;
  }
  // The four lanes into one, then the remaining 16-byte blocks.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = Fold(k, x1, x2);
  x1 = Fold(k, x1, x3);
  x1 = Fold(k, x1, x4);
  while (length >= 16) {
    x1 = Fold(k, x1, Load(data));
    data += 16;
    length -= 16;
  }
  // 128 bits to 64.
  const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x2 = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_and_si128(x1, mask32);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k, 0x00), x2);
  // Barrett reduction to 32 bits.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  x2 = _mm_and_si128(x1, mask32);
  x2 = _mm_clmulepi64_si128(x2, k, 0x10);
  x2 = _mm_and_si128(x2, mask32);
  x2 = _mm_clmulepi64_si128(x2, k, 0x00);
  x1 = _mm_xor_si128(x1, x2);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

bool HasPclmul() {
  static const bool supported =
      __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return supported;
}

#endif

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, size_t length) {
  const auto* bytes = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (length >= 64 && HasPclmul()) {
    const size_t blocks = length & ~size_t{15};
    crc = ~FoldPclmul(bytes, blocks, ~crc);
    bytes += blocks;
    length -= blocks;
  }
#endif
  return length == 0 ? crc : ZlibCrc32(crc, bytes, length);
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

bool Crc32IsAccelerated() {
#if defined(__x86_64__)
  return HasPclmul();
#else
  return false;
#endif
}

}  // namespace reshard
