// A stretch of a file or a stream, shared by readers (ByteSource) and writer chains.

#ifndef RESHARD_LIB_IO_BYTE_RANGE_H_
#define RESHARD_LIB_IO_BYTE_RANGE_H_

#include <cstdint>

namespace reshard {

// Bytes [offset, offset + length).
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t end() const { return offset + length; }
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_BYTE_RANGE_H_
