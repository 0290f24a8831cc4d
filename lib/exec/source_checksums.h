// Checks the CRC-32s that inputs record for ranges of their files (the stored zip entries of
// torch.save archives) against the bytes a conversion reads, fused into the read pass.
//
// The read pass reports each contiguous run of source bytes it reads (`Record`); the CRC-32 of
// the run is computed there, while the bytes are in the output buffer or the cache, and merged
// with the runs next to it (crc32_combine), so one tensor read front to back, however it is
// windowed, ends as one fragment per range. `Verify`, after the pass, completes each range that
// was read from: the bytes no run covered (the parts of a record no tensor reads, strided
// views, overlaps) are read with pread, and the whole range's CRC-32 is compared with the
// recorded one. Ranges nothing was read from are not checked.
//
// Memory is bounded: a range keeps at most kMaxFragmentsPerRange fragments and all ranges
// together kMaxFragments; runs beyond that are left to Verify's reads.

#ifndef RESHARD_LIB_EXEC_SOURCE_CHECKSUMS_H_
#define RESHARD_LIB_EXEC_SOURCE_CHECKSUMS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/catalog.h"
#include "lib/io/mapped_file.h"

namespace reshard {

class SourceChecksums {
 public:
  static constexpr size_t kMaxFragmentsPerRange = 1024;
  static constexpr size_t kMaxFragments = 1 << 16;

  // An upper bound of the memory a SourceChecksums of `sources` holds: its copy of the ranges
  // and at most kMaxFragments fragments.
  static uint64_t MemoryBound(const std::vector<SourceFile>& sources);

  // `sources` indexed like the plan's sources; their checksummed ranges (copied) are the ones
  // checked.
  explicit SourceChecksums(const std::vector<SourceFile>& sources);

  // Whether any source has a checksummed range (nothing to do otherwise).
  bool empty() const { return empty_; }

  // Bytes [offset, offset + length) of source `file`, a copy of which is at `data`, were read
  // for tensor `tensor`. With `data` null the run was not read contiguously (a strided view):
  // the ranges it touches are marked read and Verify reads them. Thread safe.
  void Record(int file, uint64_t offset, uint64_t length, const std::byte* data,
              absl::string_view tensor);

  // Checks every range that was read from, reading with pread the bytes the pass did not
  // cover. DataLoss naming the file, the range (zip entry), its byte offset and a tensor that
  // reads from it on the first mismatch. Call after all Record calls; `sources` as mapped by
  // the Executor.
  absl::Status Verify(const std::vector<MappedFile>& sources) const;

  // Bytes Verify read to complete ranges (for tests and the bench).
  uint64_t bytes_reread() const { return bytes_reread_.load(); }

 private:
  struct Fragment {
    uint64_t length = 0;
    uint32_t crc32 = 0;
  };
  struct Range {
    ChecksummedRange range;
    mutable absl::Mutex mu;
    bool read ABSL_GUARDED_BY(mu) = false;
    std::string tensor ABSL_GUARDED_BY(mu);                      // the first tensor read from it
    std::map<uint64_t, Fragment> fragments ABSL_GUARDED_BY(mu);  // by offset; disjoint
  };
  struct File {
    std::vector<std::unique_ptr<Range>> ranges;  // by offset
    std::vector<uint64_t> reach;                 // reach[i]: the furthest end of ranges[0..i]
  };

  void Add(Range& range, uint64_t offset, uint64_t length, const std::byte* data,
           absl::string_view tensor);
  absl::Status VerifyRange(const MappedFile& source, const Range& range) const;

  std::vector<File> files_;
  bool empty_ = true;
  std::atomic<size_t> fragments_{0};
  mutable std::atomic<uint64_t> bytes_reread_{0};
};

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_SOURCE_CHECKSUMS_H_
