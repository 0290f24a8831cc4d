// How conversions move their bytes between the disk and memory.
//
// The page cache costs a kernel copy of every byte in each direction and, on a fast disk,
// makes a same-dtype conversion CPU-bound in the kernel; it also evicts what other jobs of the
// node had cached. So by default outputs are written with direct I/O (O_DIRECT: the device
// reads the window buffers, no copy, no cached pages) where the filesystem allows it, inputs
// read in whole tensors are read with direct I/O too, strided inputs (splits) are read buffered
// (the kernel's readahead keeps the device busy), and the pages a conversion read or wrote
// through the cache are dropped behind it.

#ifndef RESHARD_LIB_IO_IO_MODE_H_
#define RESHARD_LIB_IO_IO_MODE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

enum class IoMode {
  // Direct I/O where the filesystem takes it (detected per file: tmpfs and some network
  // filesystems refuse O_DIRECT), buffered otherwise: for outputs, and for the whole boxes of
  // inputs read once (SourcesReadDense, AnalyzeSourceReads); strided boxes and boxes read
  // several times (replicated tensors) read buffered; pages read or written through the page
  // cache dropped from it behind the conversion.
  kAuto,
  // Direct I/O for outputs and for contiguous input runs (the least kernel CPU, no page cache
  // traffic at all), an error naming the file where the filesystem refuses it.
  kDirect,
  // Plain buffered reads and writes; what was read and written stays in the page cache (for an
  // output read again right away).
  kBuffered,
};

// "auto", "direct" or "buffered".
absl::string_view IoModeName(IoMode mode);
// The inverse of IoModeName; InvalidArgument naming the choices for anything else.
absl::StatusOr<IoMode> ParseIoMode(absl::string_view name);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_IO_MODE_H_
