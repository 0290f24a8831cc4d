#include "lib/io/crc32.h"

#include <isa-l/crc.h>
#include <zlib.h>

namespace reshard {

uint32_t Crc32(uint32_t crc, const void* data, size_t length) {
  // ISA-L's reflected IEEE CRC takes and returns zlib's (final, inverted) form, so runs chain
  // as with crc32_z; it picks its PCLMULQDQ/AVX-512 kernel for the CPU at run time.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data),
                         static_cast<uint64_t>(length));
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return static_cast<uint32_t>(::crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

bool Crc32IsAccelerated() {
#if defined(__x86_64__)
  static const bool supported = __builtin_cpu_supports("pclmul");
  return supported;
#else
  return false;
#endif
}

}  // namespace reshard
