// Byte sources over a fuzzer's input, for libFuzzer targets that parse the same bytes both as a
// mapped file and as a remote one.

#ifndef RESHARD_LIB_TESTING_FUZZ_SOURCES_H_
#define RESHARD_LIB_TESTING_FUZZ_SOURCES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "lib/io/byte_source.h"

namespace reshard {

// Range reads of `data` (not owned) with small windows (64-byte merge gap, 256-byte reads, two
// in flight), so that prefetches merge and split; a read past the end of `data` aborts, for the
// fuzzer to report.
std::unique_ptr<RangeReadSource> SmallWindowRangeReads(const uint8_t* data, size_t size,
                                                       std::string path);

}  // namespace reshard

#endif  // RESHARD_LIB_TESTING_FUZZ_SOURCES_H_
