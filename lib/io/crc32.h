// CRC-32 (IEEE 802.3, reflected, as zip and zlib compute it), fast.
//
// zlib's crc32_z runs at about 4.5-5.7 GB/s on the machines we measure on, which is close to
// what the page cache delivers, so checking every byte a conversion reads (or writes into a
// torch zip) with it costs a tenth of the conversion. Intel's ISA-L (Debian's libisal)
// computes the same CRC with carry-less multiplication (PCLMULQDQ, AVX-512 where present),
// chosen for the CPU at run time; zlib combines CRCs of adjacent runs.

#ifndef RESHARD_LIB_IO_CRC32_H_
#define RESHARD_LIB_IO_CRC32_H_

#include <cstddef>
#include <cstdint>

namespace reshard {

// The CRC-32 of `length` bytes at `data` continuing `crc` (0 to start), exactly as zlib's
// crc32_z(crc, data, length).
uint32_t Crc32(uint32_t crc, const void* data, size_t length);

// The CRC-32 of A followed by B from those of A and B (zlib's crc32_combine).
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// Whether Crc32 uses the carry-less multiplication path on this CPU.
bool Crc32IsAccelerated();

}  // namespace reshard

#endif  // RESHARD_LIB_IO_CRC32_H_
