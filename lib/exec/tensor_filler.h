// Produces the dense output data of one tensor, window by window, from mapped source files.

#ifndef RESHARD_LIB_EXEC_TENSOR_FILLER_H_
#define RESHARD_LIB_EXEC_TENSOR_FILLER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/exec/span_reader.h"
#include "lib/io/mapped_file.h"
#include "lib/io/remote_runs.h"
#include "lib/io/scratch_copy.h"
#include "lib/plan/layout.h"

namespace reshard {

// Fills consecutive element ranges of a TensorCopy's dense output. Each CopyItem keeps a row
// cursor, so a whole tensor costs O(rows) however it is windowed. Not thread safe; one filler
// per tensor being written.
class TensorFiller {
 public:
  // `sources` must outlive the filler and be indexed like the plan's sources; every byte the
  // filler reads goes through their reads (MappedFile::ReadAt, Run, ...), so their read stages
  // see it. `spans`, when not null, is the worker's SpanReader: short rows are read through it (see kShortRowBytes),
  // and every contiguous run of a source with direct reads (MappedFile::EnableDirectReads),
  // converted on the way out; only one filler may use it at a time.
  TensorFiller(const TensorCopy& copy, const std::vector<MappedFile>& sources,
               SpanReader* spans = nullptr);

  // Rows copied unchanged that are shorter than this are not read one pread each: one read
  // fills a span with the source bytes of the rows that follow (up to the end of the item's
  // source range), and the rows are copied out of it. A split along the last dimension
  // (rows of a few KiB) then costs one system call per span instead of one per row.
  static constexpr uint64_t kShortRowBytes = 64 << 10;
  // ...unless the rows are strips of longer source rows with at least this many other bytes
  // between them: then one pread each copies only them. A span copies the bytes between
  // strips too (the other parts'), a pread costs a system call (about 1.5 us, the time to copy
  // 15 KiB out of the page cache): 4 KiB strips of 16 KiB rows (a Llama down_proj split in 4)
  // took 0.95x the wall time and 0.87x the CPU read through spans as one pread each.
  static constexpr uint64_t kStripGapBytes = 16 << 10;

  // Items whose elements are strided in a remote source (src_strides.back() != 1: a DCP chunk
  // saved column-major) are gathered from a local copy of their source range [src_offset,
  // src_end) (lib/io/scratch_copy.h), fetched once when the item is first filled and dropped
  // when its last element is: the gather reads all over the range in every window, which
  // spans (read front to back, a few MiB at a time) cannot serve without fetching the range
  // again window after window. The copies a filler holds at once are kept in memory while
  // they add up to at most kStagedMemoryBytes (the chunks of a tensor cut by columns take
  // turns in every window, each staged until the tensor is done), the others go to unlinked
  // scratch files, mapped like local inputs. Each byte of such a range is fetched once per
  // item; an item that reads only part of its range (one part of a split of a transposed
  // piece) fetches the bytes between its elements as well.
  static constexpr uint64_t kStagedMemoryBytes = 4 << 20;

  // A tensor gathered from runs of remote files (GathersRemoteRuns: a ZeRO-3 parameter, one
  // run in every rank's file; a tensor of one file written through a FileWriter in its own
  // dtype) is not read through the SpanReader, which has at most the current run and the next
  // in flight: each window's runs are fetched together with ReadRemoteRuns
  // (lib/io/remote_runs.h), up to MappedFile::kRemotePiecesInFlight range requests at once,
  // straight into the output when the dtype stays, else into a scratch buffer of at most this
  // many bytes at a time, converted from there. Written through a FileWriter, the windows'
  // requests are queued instead (set_run_queue), so that the next window's are under way while
  // the current one's end, the scratch buffer then the queue's. The executor lets such a
  // converting fill read this much (not kMappedBytesPerFill: nothing is mapped): eight
  // requests of 2 MiB in flight, where 4 MiB fills made four of 1 MiB, and a bf16 ZeRO-3
  // consolidation from a local radosgw waited a round trip for each (3.7x boto3's time).
  static constexpr uint64_t kRunScratchBytes = 16 << 20;

  // Whether a filler of `copy` fetches its windows' runs together (above): each item with
  // elements is read from a remote source (`remote(src_file)`) and is one run in both the
  // source and the output (both dense, same order), so that a window's part of it is one run
  // too; and it has several items, or one that keeps its dtype when its requests are `queued`
  // (set_run_queue). Such a tensor is read straight into the window, its requests under way
  // while the windows before it are written, where a SpanReader has one span and the next in
  // flight and cuts them at the tensor's end: a torch.save archive's records lie in the order
  // of their keys as strings ("data/0", "data/1", "data/10", ...), not in the tensors', so
  // the tensor read next is seldom the record after.
  template <typename IsRemote>
  static bool GathersRemoteRuns(const TensorCopy& copy, IsRemote remote, bool queued = false);

  // The most memory the fillers of `copy` (and of its mean terms) hold for remote sources
  // besides the window: for strided items, kStagedMemoryBytes of copies in memory plus the
  // piece buffer of one scratch file being written (ScratchCopy::kPieceBytes), for each filler
  // that stages; kRunScratchBytes for a converted gather of remote runs; 0 when neither.
  // `sources` indexed like the items' src_file.
  static uint64_t StagingMemoryBound(const TensorCopy& copy,
                                     const std::vector<SourceFile>& sources);

  // Writes elements [begin, end) of the output tensor, converted to its dtype, to `out`
  // ((end - begin) * element size bytes). Rows stored contiguously in the output dtype are
  // read with pread, the others through the mapping (a remote file's contiguous rows into a
  // scratch buffer, when there is no SpanReader; its strided items from their local copies,
  // see kStagedMemoryBytes). Errors name the file and offset.
  // Precondition: ranges are consecutive, front to back.
  absl::Status Fill(int64_t begin, int64_t end, std::byte* out);

  // The first source run a filler of `copy` reads (its first item's), for a SpanReader to read
  // ahead; file -1 when it reads nothing.
  static SpanReader::Run FirstRun(const TensorCopy& copy);
  // The run read after this tensor's last (the next tensor's FirstRun): read ahead while the
  // last run of this one is copied.
  void set_following(SpanReader::Run run) { following_ = run; }

  // Lets the reads of the next fills extend to the rows of output elements before `element`
  // (at least): an output file written in turns with others (WriteInLockstep in file_writer.cc)
  // fills a step of the tensor window by window, and reads the step's rows in one span, which
  // the other files then read their strips from. Without it, reads stop at the window's rows.
  void set_read_to(int64_t element) { read_to_ = element; }
  // Reads strips of rows as whole rows (directly where the source reads dense boxes directly):
  // when all the output files that read the rows' other strips are written in turns with this
  // one, every byte of the rows a span holds is used, and reading them past the page cache is
  // as right as reading a whole box.
  void set_strips_whole(bool whole) { strips_whole_ = whole; }

  // Hands back to the kernel the source pages read since the last call (MappedFile::Release),
  // and drops the bytes read from the page cache where the source drops behind (DropCached).
  void ReleaseConsumed();

  // Source bytes read so far.
  uint64_t bytes_read() const { return bytes_read_; }
  // Whether this filler fetches its windows' runs together (GathersRemoteRuns).
  bool gathers_remote_runs() const { return gathers_remote_runs_; }
  // Fill of a filler that gathers remote runs queues the window's requests on `queue` and
  // returns before they are read: the caller waits for them (RemoteRunQueue::Wait) before it
  // uses the output, so that the next window's requests can be under way meanwhile. The
  // queue must hold at least kRunScratchBytes of scratch memory when the fill converts, and
  // reports read errors (naming the tensor, the object and the run's byte offset) at Wait.
  // A single item that keeps its dtype gathers once the queue is set (GathersRemoteRuns).
  void set_run_queue(RemoteRunQueue* queue);
  // Remote source bytes fetched into local copies for strided items (kStagedMemoryBytes).
  uint64_t staged_bytes() const { return staged_bytes_; }
  // True when every element is copied unchanged from contiguous source rows (pread only, no
  // dtype conversion or gather): the executor books such fills as reading, the others as
  // converting.
  bool plain_copy() const { return plain_copy_; }

 private:
  struct Cursor {
    std::vector<int64_t> index;  // over all but the last dimension
    int64_t row_dst = 0;         // output element where the current row starts
    uint64_t row_src = 0;        // source byte where the current row starts
    bool done = false;
  };
  struct Touched {
    uint64_t begin = UINT64_MAX;
    uint64_t end = 0;
  };

  void Advance(const CopyItem& item, Cursor& cursor) const;
  // Whether `item` may be read through spans: its rows are contiguous in the source. Strided
  // elements are gathered from the mapping or a local copy instead.
  static bool ReadsSpans(const CopyItem& item) { return item.src_strides.back() == 1; }
  // One past the last source byte item `i` reads for output elements before `end`, from its
  // cursor on (an estimate for items of more than two dimensions); the item's end when the
  // tensor has one item, which then streams through spans across windows.
  uint64_t FillLimit(size_t i, int64_t end) const;
  // The run read after item i's part of the window [begin, end): the next item with rows in
  // it, else the first item of the next window, else the next tensor (set_following).
  SpanReader::Run NextRun(size_t i, int64_t begin, int64_t end) const;
  // Converts `count` contiguous source elements at `offset` of `file` into `out` through the
  // SpanReader, a span at a time; `item_end` bounds the span read when the bytes are not in
  // one already.
  // `next` is the run read after this item's (SpanReader::Get); `direct`: read the item's
  // bytes directly (MappedFile::ReadsDirectly).
  absl::Status CopyThroughSpan(int file, uint64_t offset, int64_t count, uint64_t item_end,
                               const SpanReader::Run& next, bool direct, uint64_t lead,
                               std::byte* out);

  // Strided elements of a mapped source (a transposed view: each element on its own source
  // row) are gathered block by block across all the window's rows of the item, and each
  // block's pages are released before the next: a window of whole output rows would
  // otherwise fault in every page of the tensor's source (a page per source row) at once.
  // A block releases the pages at its ends and those mapped around them too
  // (MappedFile::Release): every window starts at another column, so pages left at block ends
  // would add up over the tensor.
  static constexpr uint64_t kGatherBlockBytes = 1 << 20;
  struct StridedRun {
    uint64_t src_byte = 0;  // the run's first element
    int64_t count = 0;
    std::byte* out = nullptr;
  };
  void GatherInBlocks(const MappedFile& source, int64_t stride,
                      const std::vector<StridedRun>& runs);

  // The window's part of an item: one run of its source file and of the output.
  struct Part {
    int file = -1;
    uint64_t src = 0;     // source byte of its first element
    int64_t element = 0;  // output element of its first element
    int64_t count = 0;
  };
  // Fill for a filler that GathersRemoteRuns: the window's part of every item, all fetched
  // at once (ReadRemoteRuns), in batches of kRunScratchBytes when converting; or queued
  // (set_run_queue).
  absl::Status FillRemoteRuns(int64_t begin, int64_t end, std::byte* out);
  // Queues the requests of `parts` (elements [begin, ...) of the output at `out`) on
  // run_queue_, each converted on the queue's thread.
  absl::Status QueueRemoteRuns(std::vector<Part> parts, int64_t begin, std::byte* out);

  // The local copy of item i's source range (a remote source's strided item), fetched now
  // unless it is held already.
  absl::StatusOr<const ScratchCopy*> Staged(size_t i);
  // Drops item i's copy (its last element is filled).
  void Unstage(size_t i);

  const TensorCopy& copy_;
  const std::vector<MappedFile>& sources_;
  // A remote file's run to convert, read without spans, or a batch of runs (FillRemoteRuns).
  std::vector<std::byte> scratch_;
  std::vector<Cursor> cursors_;
  SpanReader::Run following_;
  int64_t read_to_ = 0;        // set_read_to
  bool strips_whole_ = false;  // set_strips_whole
  // Whether item i is read as a whole box (MappedFile::ReadsDirectly).
  bool ReadsWhole(size_t i) const { return item_dense_[i] || strips_whole_; }
  std::vector<Touched> touched_;          // per source file: mapped bytes since the last release
  std::vector<Touched> read_run_;         // per source file: the contiguous run of bytes read last
  std::vector<uint64_t> item_src_end_;    // per item: the end of the source bytes it reads
  std::vector<bool> item_rows_adjacent_;  // per item: its rows are contiguous in the source
  std::vector<uint64_t> item_row_gap_;    // per item: source bytes between one row and the next
  std::vector<bool> item_dense_;          // per item: it reads every byte of [src, src_end)
  std::vector<std::optional<ScratchCopy>> staged_;  // per item: its copy (Staged)
  std::vector<Touched> staged_touched_;  // per item: bytes of its copy gathered since the release
  uint64_t staged_memory_ = 0;           // bytes of the copies held in memory
  uint64_t staged_bytes_ = 0;            // staged_bytes()
  SpanReader* const spans_;
  size_t src_element_size_;
  size_t dst_element_size_;
  bool plain_copy_ = true;
  bool gathers_remote_runs_ = false;  // GathersRemoteRuns
  RemoteRunQueue* run_queue_ = nullptr;  // set_run_queue
  uint64_t bytes_read_ = 0;
};

template <typename IsRemote>
bool TensorFiller::GathersRemoteRuns(const TensorCopy& copy, IsRemote remote, bool queued) {
  // One item streams through whole spans, unless its requests are queued and it reads into place.
  if (copy.items.size() < 2 && !(queued && copy.src_dtype == copy.dst_dtype)) return false;
  bool any = false;
  for (const CopyItem& item : copy.items) {
    if (item.num_elements() == 0) continue;
    if (!remote(item.src_file)) return false;
    // Dense in the source and in the output: row-major strides of its extent in both, but
    // for dimensions of extent 1, whose stride never applies.
    int64_t stride = 1;
    for (size_t d = item.extent.size(); d-- > 0;) {
      if (item.extent[d] == 1) continue;
      if (item.src_strides[d] != stride || item.dst_strides[d] != stride) return false;
      stride *= item.extent[d];
    }
    any = true;
  }
  return any;
}

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_TENSOR_FILLER_H_
