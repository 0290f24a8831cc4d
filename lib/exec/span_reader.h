// Reads source bytes for one worker in spans of a few MiB, the next span read ahead on a helper
// thread while the current one is consumed.
//
// With direct I/O (MappedFile::EnableDirectReads) nothing reads ahead for us: a synchronous
// read leaves the device idle while the worker converts and copies, and the worker idle while
// the device reads (measured: 1.4x the wall time of buffered reads on one output file). So the
// span that follows the one just read, in the same file, is read on a helper thread into the
// second buffer: a conversion reading a file front to back waits only for the first span of
// each run. Without direct reads the kernel's readahead does this, and spans are read
// synchronously (short rows, see TensorFiller::kShortRowBytes).
//
// A remote source (MappedFile::remote) is always read directly, and in whole spans when the
// next run continues the current one in the same file: the span is not cut at the run's
// `limit`, so the short tensors that follow come with one request instead of one each, and
// the span read ahead continues the file while the next run starts inside the current span.

#ifndef RESHARD_LIB_EXEC_SPAN_READER_H_
#define RESHARD_LIB_EXEC_SPAN_READER_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "lib/io/mapped_file.h"
#include "lib/io/page_buffer.h"

namespace reshard {

class SpanReader {
 public:
  // Two buffers of `span_bytes` (plus the blocks direct reads need around them), mapped now
  // and touched when used. The helper thread starts with the first read ahead.
  explicit SpanReader(size_t span_bytes);
  ~SpanReader();
  SpanReader(const SpanReader&) = delete;
  SpanReader& operator=(const SpanReader&) = delete;

  // The most bytes one Get may ask for. Spans are read ahead from overlap() bytes before the
  // end of the current one, so that a request shorter than that which straddles the end (an
  // element cut by it) is in the span read ahead; a run read in pieces of capacity() is too.
  // One direct-read block: a direct read starts at a block boundary anyway, so the overlap
  // costs at most that block again rather than a sixteenth of every span.
  uint64_t capacity() const { return capacity_ - overlap(); }
  uint64_t overlap() const {
    return std::min<uint64_t>(capacity_ / 16, MappedFile::kDirectAlignment);
  }

  // Source bytes from `offset` on, at least `length`: all that the span holding them has.
  struct Bytes {
    const std::byte* data = nullptr;
    uint64_t size = 0;
  };

  // Source bytes a caller will ask for next: [offset, limit) of sources[file].
  struct Run {
    int file = -1;  // none
    uint64_t offset = 0;
    uint64_t limit = 0;
    // The run reads every byte of its box (MappedFile::ReadsDirectly): read ahead directly.
    bool dense = true;
  };

  // The bytes [offset, offset + length) of `sources[file]` (length <= capacity()) and those
  // that follow them in the same span, valid until the next call. A caller that consumes what
  // it is given and asks again from there reads a file front to back without waiting for a
  // read after the first. Unless the current span, the one before it (while no read ahead has
  // taken its buffer: callers taking turns over the same rows, see WriteInLockstep in
  // file_writer.cc) or the read-ahead span holds them, reads the span
  // [offset, max(offset + length, min(limit, offset + span size))). Then, for a source read
  // directly, reads ahead:
  //   * without `next`, the span after the current one in the same file (overlapping it by
  //     overlap()), whatever `limit` says;
  //   * with `next` (the run the caller reads once it reaches `limit`), the span after the
  //     current one up to `limit` while the current one ends before it, then the first span of
  //     `next`. A caller gathering runs from several files (a ZeRO-3 parameter is one run in
  //     each rank's file) thus has the next run read while it copies this one, and no span is
  //     read that it will not use.
  // `direct` false reads a source that has direct reads through the page cache all the same
  // (MappedFile::ReadsDirectly), and nothing is read ahead for it.
  // Errors name the file and offset.
  // `sources` must outlive the reader. Not thread safe: one worker calls it.
  // `lead`: a span read for this request starts up to that many bytes before `offset` (within
  // the file): a strip of rows passes `lead` = the bytes between its strips, so that a span it
  // reads also holds the strips before it in the same row, which other output files written
  // in turns read (WriteInLockstep in file_writer.cc).
  absl::StatusOr<Bytes> Get(const std::vector<MappedFile>& sources, int file, uint64_t offset,
                            uint64_t length, uint64_t limit, const Run* next = nullptr,
                            bool direct = true, uint64_t lead = 0);

  // For output files written in turns (WriteInLockstep in file_writer.cc): a short request (its
  // run, up to `limit`, at most kSideBytes) that no span holds is read into a side buffer, so
  // that it does not push out the spans the other files come back to (a column of one file
  // beside the strips of another), and spans take turns in three buffers, so that the previous
  // span survives a read ahead. Not thread safe; set between Gets.
  void set_files_in_turns(bool in_turns) { in_turns_ = in_turns; }
  static constexpr uint64_t kSideBytes = 64 << 10;

  // Spans read on the worker's thread, and spans the helper had read ahead when they were needed.
  uint64_t reads_waited() const { return reads_waited_; }
  uint64_t reads_ahead_used() const { return reads_ahead_used_; }
  // Spans read ahead that the next Get did not ask for (read for nothing).
  uint64_t reads_ahead_unused() const { return reads_ahead_unused_; }
  // Bytes of every span read, waited for or ahead (before rounding to direct-read blocks).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  struct Span {
    const MappedFile* source = nullptr;
    uint64_t begin = 0;
    uint64_t end = 0;
    const std::byte* data = nullptr;  // the byte at `begin`
    int buffer = 0;
    bool direct = true;
    bool Holds(const MappedFile* file, uint64_t offset, uint64_t length) const {
      return source == file && data != nullptr && offset >= begin && offset + length <= end;
    }
  };

  // Reads [begin, end) of `source` into buffer `buffer`, directly when `direct` and the
  // source has direct reads.
  absl::StatusOr<Span> Read(const MappedFile& source, uint64_t begin, uint64_t end, int buffer,
                            bool direct) const;
  void HelperLoop();
  // Whether `next` starts at `end` or a few bytes after it, at most overlap(): the data
  // descriptor and local header between two records of a torch.save archive (100-odd bytes).
  // A remote read goes on over them to the next run (one direct-read block more at most, as
  // a direct read may read anyway), as a request costs a round trip.
  bool ContinuesAfter(const Run& next, uint64_t end) const {
    return next.offset >= end && next.offset - end <= overlap();
  }
  bool HelperHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (requested_ && !done_);
  }
  bool AheadIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !requested_ || done_; }

  const uint64_t capacity_;  // bytes of a span
  // A buffer for the next read that holds neither the current span nor, for files written in
  // turns, the previous one (which is dropped otherwise when it is in the buffer returned).
  int FreeBuffer();

  // The spans' buffers 0 and 1, the side buffer 2 and, for files written in turns, a third
  // span buffer (set_files_in_turns); each mapped now and touched when first used.
  static constexpr int kThirdBuffer = 3;
  std::array<PageBuffer, 4> buffers_;
  bool in_turns_ = false;
  Span side_;      // what the side buffer holds
  Span current_;   // the worker's; its buffer is not the read-ahead's
  Span previous_;  // the span before current_, until a read takes its buffer (FreeBuffer)
  uint64_t reads_waited_ = 0;
  uint64_t reads_ahead_used_ = 0;
  uint64_t reads_ahead_unused_ = 0;
  uint64_t bytes_read_ = 0;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;  // a read ahead was asked for...
  bool done_ ABSL_GUARDED_BY(mu_) = false;       // ...and has finished
  Span ahead_ ABSL_GUARDED_BY(mu_);              // what was asked for, then what was read
  absl::Status ahead_status_ ABSL_GUARDED_BY(mu_);
  std::thread helper_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_SPAN_READER_H_
