#include "lib/exec/tensor_filler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/exec/dtype_convert.h"
#include "lib/io/file_access.h"
#include "lib/io/remote_runs.h"

namespace reshard {
namespace {

// Whether the source `file` is read with requests (MappedFile::mapped is false).
struct IsRemoteSource {
  const std::vector<MappedFile>* sources;
  bool operator()(int file) const {
    return file >= 0 && static_cast<size_t>(file) < sources->size() &&
           !(*sources)[file].mapped();
  }
};

}  // namespace

TensorFiller::TensorFiller(const TensorCopy& copy, const std::vector<MappedFile>& sources,
                           SpanReader* spans)
    : copy_(copy),
      sources_(sources),
      touched_(sources.size()),
      read_run_(sources.size()),
      staged_(copy.items.size()),
      staged_touched_(copy.items.size()),
      spans_(spans),
      src_element_size_(DTypeSize(copy.src_dtype)),
      dst_element_size_(DTypeSize(copy.dst_dtype)) {
  cursors_.resize(copy.items.size());
  plain_copy_ = copy.src_dtype == copy.dst_dtype;
  for (size_t i = 0; i < copy.items.size(); ++i) {
    const CopyItem& item = copy.items[i];
    if (item.src_strides.back() != 1) plain_copy_ = false;
    Cursor& cursor = cursors_[i];
    item_src_end_.push_back(item.src_end(src_element_size_));
    // Rows that follow each other in the source: a span read holds only bytes this item reads.
    const size_t n = item.extent.size();
    item_rows_adjacent_.push_back(n < 2 || item.src_strides[n - 2] == item.extent[n - 1]);
    item_row_gap_.push_back(
        item_rows_adjacent_.back()
            ? 0
            : static_cast<uint64_t>(std::max<int64_t>(
                  0, item.src_strides[n - 2] - item.extent[n - 1] * item.src_strides[n - 1])) *
                  src_element_size_);
    item_dense_.push_back(item.num_elements() > 0 &&
                          item_src_end_.back() - item.src_offset ==
                              static_cast<uint64_t>(item.num_elements()) * src_element_size_);
    cursor.index.assign(item.extent.size() - 1, 0);
    cursor.row_dst = item.dst_offset;
    cursor.row_src = item.src_offset;
    for (int64_t extent : item.extent) {
      if (extent == 0) cursor.done = true;
    }
  }
  gathers_remote_runs_ = GathersRemoteRuns(copy, IsRemoteSource{&sources});
}

void TensorFiller::set_run_queue(RemoteRunQueue* queue) {
  run_queue_ = queue;
  gathers_remote_runs_ = GathersRemoteRuns(copy_, IsRemoteSource{&sources_}, queue != nullptr);
}

void TensorFiller::Advance(const CopyItem& item, Cursor& cursor) const {
  // Odometer over the leading dimensions, keeping the row's start offsets incrementally.
  for (int d = static_cast<int>(cursor.index.size()) - 1; d >= 0; --d) {
    if (++cursor.index[d] < item.extent[d]) {
      cursor.row_dst += item.dst_strides[d];
      cursor.row_src += static_cast<uint64_t>(item.src_strides[d]) * src_element_size_;
      return;
    }
    cursor.row_dst -= item.dst_strides[d] * (item.extent[d] - 1);
    cursor.row_src -=
        static_cast<uint64_t>(item.src_strides[d]) * (item.extent[d] - 1) * src_element_size_;
    cursor.index[d] = 0;
  }
  cursor.done = true;
}

uint64_t TensorFiller::FillLimit(size_t i, int64_t end) const {
  end = std::max(end, read_to_);
  const CopyItem& item = copy_.items[i];
  const Cursor& cursor = cursors_[i];
  if (copy_.items.size() == 1 || cursor.done || cursor.row_dst >= end) return item_src_end_[i];
  const size_t n = item.extent.size();
  const int64_t remaining = end - cursor.row_dst;  // output elements from the cursor's row on
  uint64_t bytes;
  if (n == 1) {
    bytes = static_cast<uint64_t>(remaining) * item.src_strides.back() * src_element_size_;
  } else {
    // Rows that start before `end`, at the innermost row stride (an estimate across outer
    // dimensions: reading more or less there costs a read, never a byte).
    const int64_t row_stride = std::max<int64_t>(item.dst_strides[n - 2], 1);
    const int64_t rows = (remaining + row_stride - 1) / row_stride;
    bytes = static_cast<uint64_t>(rows) * item.src_strides[n - 2] * src_element_size_;
  }
  return std::min(item_src_end_[i], cursor.row_src + bytes);
}

SpanReader::Run TensorFiller::NextRun(size_t i, int64_t begin, int64_t end) const {
  const size_t items = copy_.items.size();
  // Another item with rows in this window: it is filled next. Strided items are never read
  // through spans (Fill): reading them ahead would fetch bytes for nothing.
  for (size_t j = i + 1; j < items; ++j) {
    if (!cursors_[j].done && cursors_[j].row_dst < end && ReadsSpans(copy_.items[j])) {
      return {copy_.items[j].src_file, cursors_[j].row_src, FillLimit(j, end), ReadsWhole(j)};
    }
  }
  // The next window's first item (assumed as large as this one); item i itself continues
  // where this window's part of it ends.
  const int64_t next_end = end + (end - begin);
  for (size_t k = 0; k < items; ++k) {
    if (cursors_[k].done || !ReadsSpans(copy_.items[k])) continue;
    const uint64_t from = k == i ? FillLimit(i, end) : cursors_[k].row_src;
    if (from >= item_src_end_[k]) continue;
    return {copy_.items[k].src_file, from, std::max(from, FillLimit(k, next_end)), ReadsWhole(k)};
  }
  return following_;
}

absl::Status TensorFiller::Fill(int64_t begin, int64_t end, std::byte* out) {
  const bool same_dtype = copy_.src_dtype == copy_.dst_dtype;
  // The items leave gaps (elements beyond the source): those are zeros. All-zero bits are 0 in
  // every dtype reshard writes.
  if (copy_.zero_fill) std::memset(out, 0, static_cast<size_t>(end - begin) * dst_element_size_);
  if (gathers_remote_runs_) return FillRemoteRuns(begin, end, out);
  for (size_t i = 0; i < copy_.items.size(); ++i) {
    const CopyItem& item = copy_.items[i];
    Cursor& cursor = cursors_[i];
    const int64_t row_length = item.extent.back();
    const int64_t src_stride = item.src_strides.back();
    const MappedFile& source = sources_[item.src_file];
    Touched& touched = touched_[item.src_file];
    // Strided rows gathered through the mapping, converted after the loop in blocks
    // (GatherInBlocks).
    std::vector<StridedRun> strided;
    while (!cursor.done && cursor.row_dst < end) {
      const int64_t row_end = cursor.row_dst + row_length;
      const int64_t from = std::max(cursor.row_dst, begin);
      const int64_t to = std::min(row_end, end);
      if (to > from) {
        const uint64_t src_byte =
            cursor.row_src +
            static_cast<uint64_t>((from - cursor.row_dst) * src_stride) * src_element_size_;
        const uint64_t src_span =
            static_cast<uint64_t>(((to - from - 1) * src_stride + 1)) * src_element_size_;
        std::byte* destination = out + (from - begin) * dst_element_size_;
        // Contiguous runs that are converted are read too, not faulted in through the
        // mapping: pread with the kernel's readahead is faster than page faults, and mapped
        // file pages count in the process's resident memory (a bf16 conversion of a ZeRO-3
        // save peaked at 68 MiB against 47 MiB for fp32).
        // Short rows go through a span when they follow each other in the source, or are
        // strips with less than kStripGapBytes between them: a span of strips (a split along
        // the last dimension) also holds the other parts' strips, copied out of the page cache
        // for nothing, which costs less than a system call per strip only while they are few.
        const bool short_row = src_span < kShortRowBytes && item_row_gap_[i] < kStripGapBytes;
        const bool direct = source.ReadsDirectly(ReadsWhole(i), item.src_offset, item_src_end_[i]);
        const bool through_span =
            src_stride == 1 && spans_ != nullptr && (direct || !same_dtype || short_row);
        bool mapped = false;
        if (through_span) {
          // Direct reads, converted runs, short rows: through a span, converted on the way out.
          // The item after this one is read next (items are filled in order), then the
          // next tensor.
          // Items that take turns within a window (the chunks of a tensor cut by columns)
          // read only what this window needs of them: a span of one would otherwise read
          // ahead of the window, and the next item's span would evict it before the next window
          // came back for it (a DCP consolidation read 3x its input).
          const SpanReader::Run next = NextRun(i, begin, end);
          // A span of strips starts with the other strips of its first row (SpanReader::Get).
          RETURN_IF_ERROR(CopyThroughSpan(item.src_file, src_byte, to - from, FillLimit(i, end),
                                          next, direct, item_row_gap_[i], destination));
          bytes_read_ += src_span;
        } else if (same_dtype && src_stride == 1) {
          RETURN_IF_ERROR(source.ReadAt(src_byte, src_span, destination));
          bytes_read_ += src_span;
        } else if (!source.mapped() && src_stride == 1) {
          // No mapping: the run into the scratch buffer.
          scratch_.resize(src_span);
          RETURN_IF_ERROR(source.ReadAt(src_byte, src_span, scratch_.data()));
          ConvertElements(scratch_.data(), 1, copy_.src_dtype, destination, copy_.dst_dtype,
                          to - from);
          bytes_read_ += src_span;
        } else if (!source.mapped()) {
          // Strided elements of a remote file: gathered from the item's local copy, as from a
          // mapping (the same ConvertElements).
          ASSIGN_OR_RETURN(const ScratchCopy* staged, Staged(i));
          ConvertElements(staged->at(src_byte), src_stride, copy_.src_dtype, destination,
                          copy_.dst_dtype, to - from);
          bytes_read_ += static_cast<uint64_t>(to - from) * src_element_size_;
          Touched& gathered = staged_touched_[i];
          gathered.begin = std::min(gathered.begin, src_byte);
          gathered.end = std::max(gathered.end, src_byte + src_span);
        } else if (src_stride > 1) {
          source.StridedView(src_byte, src_span);  // gathered in blocks below
          strided.push_back({src_byte, to - from, destination});
          bytes_read_ += static_cast<uint64_t>(to - from) * src_element_size_;
        } else {
          mapped = true;
          const std::byte* run = src_stride == 1 ? source.Run(src_byte, src_span)
                                                 : source.StridedView(src_byte, src_span);
          ConvertElements(run, src_stride, copy_.src_dtype, destination, copy_.dst_dtype,
                          to - from);
          bytes_read_ += static_cast<uint64_t>(to - from) * src_element_size_;
        }
        if (mapped) {  // only mapped pages need releasing
          touched.begin = std::min(touched.begin, src_byte);
          touched.end = std::max(touched.end, src_byte + src_span);
        }
        if (src_stride == 1 && source.drop_behind() && !direct) {
          // Bytes read leave the page cache, exactly those: a strip of a row read for one
          // output part must not drop the bytes beside it that another part reads.
          Touched& run = read_run_[item.src_file];
          if (run.end != src_byte) {
            // A strip of rows shorter than kShortRowBytes holds a page or two: one system call
            // each costs more than the pages are worth; Execute drops what is left at the end.
            if (run.end - run.begin >= kShortRowBytes) {
              source.Release(run.begin, run.end - run.begin);  // mapped pages are not dropped
              source.DropCached(run.begin, run.end - run.begin);
            }
            run.begin = src_byte;
          }
          run.end = src_byte + src_span;
        }
      }
      if (row_end > end) break;  // the row continues in the next window
      Advance(item, cursor);
    }
    if (!strided.empty()) GatherInBlocks(source, src_stride, strided);
    if (cursor.done) Unstage(i);
  }
  return absl::OkStatus();
}

void TensorFiller::GatherInBlocks(const MappedFile& source, int64_t stride,
                                  const std::vector<StridedRun>& runs) {
  // Each block reads kGatherBlockBytes of pages at most: `block` elements of every run, each
  // element on its own source row of `runs.size()` neighbouring elements (a page or two), or
  // the whole source row where the page cache holds it in large folios, which a fault maps
  // whole (MappedFile::Release).
  const uint64_t step = static_cast<uint64_t>(stride) * src_element_size_;
  const uint64_t row_bytes = std::max<uint64_t>(runs.size() * src_element_size_ + 4096, step);
  const int64_t block = std::max<int64_t>(1, kGatherBlockBytes / row_bytes);
  int64_t longest = 0;
  for (const StridedRun& run : runs) longest = std::max(longest, run.count);
  for (int64_t first = 0; first < longest; first += block) {
    uint64_t begin = UINT64_MAX, stop = 0;
    for (const StridedRun& run : runs) {
      if (first >= run.count) continue;
      const int64_t count = std::min(block, run.count - first);
      const uint64_t src = run.src_byte + static_cast<uint64_t>(first) * step;
      ConvertElements(source.data() + src, stride, copy_.src_dtype,
                      run.out + first * dst_element_size_, copy_.dst_dtype, count);
      begin = std::min(begin, src);
      stop = std::max(stop, src + static_cast<uint64_t>(count - 1) * step + src_element_size_);
    }
    if (stop > begin) source.Release(begin, stop - begin);
  }
}

absl::Status TensorFiller::FillRemoteRuns(int64_t begin, int64_t end, std::byte* out) {
  const bool same_dtype = copy_.src_dtype == copy_.dst_dtype;
  // The window's part of each item: one run of its source file and of the output.
  std::vector<Part> parts;
  for (const CopyItem& item : copy_.items) {
    const int64_t from = std::max(begin, item.dst_offset);
    const int64_t to = std::min(end, item.dst_offset + static_cast<int64_t>(item.num_elements()));
    if (to <= from) continue;
    parts.push_back(
        Part{item.src_file,
             item.src_offset + static_cast<uint64_t>(from - item.dst_offset) * src_element_size_,
             from, to - from});
  }
  if (run_queue_ != nullptr) return QueueRemoteRuns(parts, begin, out);
  // Same dtype: the source bytes are the output bytes, read into place. Converted: batches of
  // at most kRunScratchBytes of source bytes (parts cut to fit), each fetched into the scratch
  // buffer and converted out of it.
  const int64_t batch_elements =
      same_dtype ? INT64_MAX
                 : std::max<int64_t>(1, static_cast<int64_t>(kRunScratchBytes / src_element_size_));
  if (!same_dtype) {
    // Sized once: the runs of a batch point into it.
    scratch_.resize(static_cast<size_t>(std::min(batch_elements, end - begin)) * src_element_size_);
  }
  std::vector<RemoteRun> runs;
  std::vector<Part> batch;
  auto read_batch = [&]() -> absl::Status {
    RETURN_IF_ERROR(ReadRemoteRuns(runs), absl::StrCat("tensor \"", copy_.name, "\""));
    for (size_t r = 0; r < runs.size(); ++r) {
      const Part& part = batch[r];
      if (!same_dtype) {
        ConvertElements(runs[r].out, 1, copy_.src_dtype,
                        out + (part.element - begin) * dst_element_size_, copy_.dst_dtype,
                        part.count);
      }
      bytes_read_ += runs[r].length;
    }
    runs.clear();
    batch.clear();
    return absl::OkStatus();
  };
  int64_t batched = 0;  // elements in the batch
  for (Part part : parts) {
    while (part.count > 0) {
      if (batched == batch_elements) {
        RETURN_IF_ERROR(read_batch());
        batched = 0;
      }
      Part piece = part;
      piece.count = std::min(part.count, batch_elements - batched);
      const uint64_t length = static_cast<uint64_t>(piece.count) * src_element_size_;
      std::byte* into;
      if (same_dtype) {
        into = out + (piece.element - begin) * dst_element_size_;
      } else {
        into = scratch_.data() + static_cast<uint64_t>(batched) * src_element_size_;
      }
      runs.push_back(RemoteRun{&sources_[piece.file], piece.src, length, into});
      batch.push_back(piece);
      batched += piece.count;
      part.src += length;
      part.element += piece.count;
      part.count -= piece.count;
    }
  }
  return read_batch();
}

absl::Status TensorFiller::QueueRemoteRuns(std::vector<Part> parts, int64_t begin,
                                            std::byte* out) {
  const bool same_dtype = copy_.src_dtype == copy_.dst_dtype;
  std::vector<RemoteRun> runs;
  runs.reserve(parts.size());
  for (const Part& part : parts) {
    const uint64_t length = static_cast<uint64_t>(part.count) * src_element_size_;
    // Same dtype: read into place. Converted: into the queue's scratch memory, then converted
    // into place.
    std::byte* into = same_dtype ? out + (part.element - begin) * dst_element_size_ : nullptr;
    runs.push_back(RemoteRun{&sources_[part.file], part.src, length, into});
    bytes_read_ += length;
  }
  // Called on the queue's threads, possibly after this filler is gone: it holds copies.
  RemoteRunQueue::Done done = [parts = std::move(parts), begin, out, same_dtype,
                               src_dtype = copy_.src_dtype, dst_dtype = copy_.dst_dtype,
                               src_size = src_element_size_, dst_size = dst_element_size_](
                                  size_t run, uint64_t offset, uint64_t length,
                                  const std::byte* data) {
    const Part& part = parts[run];
    if (!same_dtype) {
      // Requests are cut at element boundaries (RemoteRunQueue::Add's element_size).
      const int64_t element = part.element - begin + static_cast<int64_t>(offset / src_size);
      ConvertElements(data, 1, src_dtype, out + element * dst_size, dst_dtype,
                      static_cast<int64_t>(length / src_size));
    }
  };
  run_queue_->Add(runs, src_element_size_, absl::StrCat("tensor \"", copy_.name, "\""),
                  std::move(done));
  return absl::OkStatus();
}

absl::StatusOr<const ScratchCopy*> TensorFiller::Staged(size_t i) {
  if (staged_[i].has_value()) return &*staged_[i];
  const CopyItem& item = copy_.items[i];
  ASSIGN_OR_RETURN(
      ScratchCopy staged,
      ScratchCopy::Fetch(sources_[item.src_file], item.src_offset, item_src_end_[i],
                         kStagedMemoryBytes - staged_memory_,
                         absl::StrCat("staging the strided elements of \"", copy_.name, "\"")));
  staged_memory_ += staged.memory_bytes();
  staged_bytes_ += staged.end() - staged.begin();
  staged_[i] = std::move(staged);
  return &*staged_[i];
}

void TensorFiller::Unstage(size_t i) {
  if (!staged_[i].has_value()) return;
  staged_memory_ -= staged_[i]->memory_bytes();
  staged_[i].reset();  // a scratch file goes with its pages
  staged_touched_[i] = Touched();
}

uint64_t TensorFiller::StagingMemoryBound(const TensorCopy& copy,
                                          const std::vector<SourceFile>& sources) {
  uint64_t bound = 0;
  for (const CopyItem& item : copy.items) {
    if (item.src_strides.back() == 1 || item.num_elements() == 0) continue;
    if (item.src_file < 0 || static_cast<size_t>(item.src_file) >= sources.size()) continue;
    if (!InputReadsAreRequests(sources[item.src_file].path)) continue;
    bound = kStagedMemoryBytes + ScratchCopy::kPieceBytes;
    break;
  }
  if (copy.src_dtype != copy.dst_dtype && GathersRemoteRuns(copy, [&sources](int file) {
        return file >= 0 && static_cast<size_t>(file) < sources.size() &&
               InputReadsAreRequests(sources[file].path);
      })) {
    bound += kRunScratchBytes;
  }
  for (const TensorCopy& term : copy.mean_terms) bound += StagingMemoryBound(term, sources);
  return bound;
}

absl::Status TensorFiller::CopyThroughSpan(int file, uint64_t offset, int64_t count,
                                           uint64_t item_end, const SpanReader::Run& next,
                                           bool direct, uint64_t lead, std::byte* out) {
  while (count > 0) {
    // Whatever the span holds from here: the next Get starts where it ends, which is where
    // the span read ahead begins.
    ASSIGN_OR_RETURN(SpanReader::Bytes span, spans_->Get(sources_, file, offset, src_element_size_,
                                                         item_end, &next, direct, lead));
    const int64_t n = std::min(count, static_cast<int64_t>(span.size / src_element_size_));
    const uint64_t bytes = static_cast<uint64_t>(n) * src_element_size_;
    const std::byte* data = span.data;
    ConvertElements(data, 1, copy_.src_dtype, out, copy_.dst_dtype, n);
    out += static_cast<uint64_t>(n) * dst_element_size_;
    offset += bytes;
    count -= n;
  }
  return absl::OkStatus();
}

SpanReader::Run TensorFiller::FirstRun(const TensorCopy& copy) {
  const size_t element_size = DTypeSize(copy.src_dtype);
  for (const CopyItem& item : copy.items) {
    if (std::find(item.extent.begin(), item.extent.end(), 0) != item.extent.end()) continue;
    if (!ReadsSpans(item)) continue;  // never read through spans
    const uint64_t end = item.src_end(element_size);
    return {item.src_file, item.src_offset, end,
            end - item.src_offset == static_cast<uint64_t>(item.num_elements()) * element_size};
  }
  return {};
}

void TensorFiller::ReleaseConsumed() {
  for (size_t f = 0; f < touched_.size(); ++f) {
    if (touched_[f].end > touched_[f].begin) {
      sources_[f].Release(touched_[f].begin, touched_[f].end - touched_[f].begin);
    }
    touched_[f] = Touched();
    if (read_run_[f].end > read_run_[f].begin) {
      sources_[f].DropCached(read_run_[f].begin, read_run_[f].end - read_run_[f].begin);
    }
    read_run_[f] = Touched();
  }
  // The pages of scratch files gathered from go too; the files stay until their items are done.
  for (size_t i = 0; i < staged_.size(); ++i) {
    Touched& gathered = staged_touched_[i];
    if (staged_[i].has_value() && gathered.end > gathered.begin) {
      staged_[i]->Release(gathered.begin, gathered.end - gathered.begin);
    }
    gathered = Touched();
  }
}

}  // namespace reshard
