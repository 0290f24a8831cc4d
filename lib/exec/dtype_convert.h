// Element conversions fused into the copy: F32 <-> BF16 / F16 and BF16 <-> F16.
//
// Narrowing rounds to nearest, ties to even; NaN stays NaN (made quiet, sign and top payload
// bits kept) and +/-Inf stay Inf; finite values too large for F16 become Inf, as IEEE rounding
// demands. Widening is exact. Any other pair must be the same dtype (a plain copy).

#ifndef RESHARD_LIB_EXEC_DTYPE_CONVERT_H_
#define RESHARD_LIB_EXEC_DTYPE_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "lib/core/dtype.h"

namespace reshard {

uint16_t F32BitsToBF16Bits(uint32_t bits);
uint16_t F32BitsToF16Bits(uint32_t bits);
uint32_t F16BitsToF32Bits(uint16_t bits);
inline uint32_t BF16BitsToF32Bits(uint16_t bits) { return static_cast<uint32_t>(bits) << 16; }

// Converts `count` elements read from `src` every `src_stride` elements (of `src_dtype`) into
// `dst`, densely, as `dst_dtype`. Precondition: CanConvert(src_dtype, dst_dtype); src and dst
// do not overlap; pointers need no alignment.
void ConvertElements(const std::byte* src, int64_t src_stride, DType src_dtype, std::byte* dst,
                     DType dst_dtype, int64_t count);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_DTYPE_CONVERT_H_
