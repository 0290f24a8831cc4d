// Checks the CRC-32s an input file records for ranges of itself (the stored zip entries of a
// torch.save archive) against the bytes a pass reads: a read stage (lib/io/read_stage.h) of
// the file, attached where the executor maps its sources, the read side's match of the
// writer chain's CRC-32 stage.
//
// Every run of the file's bytes the pass reads reaches Read; the CRC-32 of the run's part in
// each range is computed there, while the bytes are hot, and merged with the runs next to it
// (crc32_combine), so one tensor read front to back, however it is windowed, ends as one
// fragment per range. A run that overlaps bytes already recorded (spans read ahead overlap the
// one before; replicated tensors are read by several parts) adds only the bytes it is first to
// read. `Verify`, after the pass, completes each range that was read from: the bytes no run
// covered (the parts of a record no tensor reads, strided views) are read with the file's
// ReadAt, and the whole range's CRC-32 is compared with the recorded one. Ranges nothing was
// read from are not checked.
//
// Memory is bounded: a range keeps at most kMaxFragmentsPerRange fragments, and the stages of
// one pass share a budget of kMaxFragments; runs beyond that are left to Verify's reads.

#ifndef RESHARD_LIB_IO_CRC32_SOURCE_H_
#define RESHARD_LIB_IO_CRC32_SOURCE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/catalog.h"
#include "lib/io/byte_range.h"
#include "lib/io/mapped_file.h"
#include "lib/io/read_stage.h"

namespace reshard {

class Crc32Source final : public ReadStage {
 public:
  static constexpr size_t kMaxFragmentsPerRange = 1024;
  static constexpr size_t kMaxFragments = 1 << 16;

  // Fragments the stages of one pass hold together (at most kMaxFragments).
  using FragmentBudget = std::atomic<size_t>;

  // An upper bound of the memory the stages of `sources` hold: their copies of the ranges and
  // at most kMaxFragments fragments together.
  static uint64_t MemoryBound(const std::vector<SourceFile>& sources);

  // Checks `ranges` (copied) of one file; `budget` (not owned) is shared by the pass's stages.
  Crc32Source(const std::vector<ChecksummedRange>& ranges, FragmentBudget* budget);

  void Read(uint64_t offset, uint64_t length, const std::byte* data) override;

  // Marks the ranges [offset, offset + length) touches as read without their bytes (Verify
  // reads them): a pass that reuses an output an earlier attempt wrote still checks its
  // sources.
  void MarkRead(uint64_t offset, uint64_t length) { Read(offset, length, nullptr); }

  // Checks every range that was read from, reading from `file` the bytes the pass did not
  // cover; `file` is the file the stage was attached to, detached now (its reads would come
  // back here). DataLoss naming the file, the range (zip entry) and its byte offset on the
  // first mismatch, followed by what `context` says of the range (the tensor read from it),
  // when set. Call after the pass.
  absl::Status Verify(
      const MappedFile& file,
      const std::function<std::string(const ChecksummedRange&)>& context = {}) const;

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
    std::map<uint64_t, Fragment> fragments ABSL_GUARDED_BY(mu);  // by offset; disjoint
  };

  // Records the run's bytes that no fragment of `range` covers yet (data null: marks it read).
  void Add(Range& range, uint64_t offset, uint64_t length, const std::byte* data);
  // Adds the fragment [offset, offset + length) with CRC-32 `crc`, merged with its neighbours;
  // nothing when another run has covered any of it meanwhile, or the fragment caps are reached.
  void Insert(Range& range, uint64_t offset, uint64_t length, uint32_t crc);
  absl::Status VerifyRange(const MappedFile& file, const Range& range,
                           const std::function<std::string(const ChecksummedRange&)>& context)
      const;

  std::vector<std::unique_ptr<Range>> ranges_;  // by offset
  std::vector<uint64_t> reach_;                 // reach_[i]: the furthest end of ranges_[0..i]
  FragmentBudget* const budget_;
  mutable std::atomic<uint64_t> bytes_reread_{0};
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_CRC32_SOURCE_H_
