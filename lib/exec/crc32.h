// CRC-32 (IEEE 802.3, reflected, as zip and zlib compute it), fast.
//
// zlib's crc32_z runs at about 4.5 GB/s on the machines we measure on, which is close to what
// the page cache delivers, so checking every byte a conversion reads (or writes into a torch
// zip) costs a tenth of the conversion. On x86-64 CPUs with PCLMULQDQ this folds 64 bytes at
// a time with carry-less multiplications ("Fast CRC Computation for Generic Polynomials Using
// PCLMULQDQ Instruction", Gopal et al., Intel 2009; the constants are the paper's for the
// reflected IEEE polynomial, as in the Linux kernel's crc32-pclmul and Chromium's zlib), and
// falls back to zlib for the tail and on other CPUs.

#ifndef RESHARD_LIB_EXEC_CRC32_H_
#define RESHARD_LIB_EXEC_CRC32_H_

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

#endif  // RESHARD_LIB_EXEC_CRC32_H_
