#include "lib/exec/span_reader.h"

#include <algorithm>

#include "lib/core/status.h"

namespace reshard {

SpanReader::SpanReader(size_t span_bytes)
    : capacity_(std::max<uint64_t>(span_bytes, MappedFile::kDirectAlignment)),
      buffers_{PageBuffer(capacity_ + 2 * MappedFile::kDirectAlignment),
               PageBuffer(capacity_ + 2 * MappedFile::kDirectAlignment),
               PageBuffer(kSideBytes + 2 * MappedFile::kDirectAlignment),
               PageBuffer(capacity_ + 2 * MappedFile::kDirectAlignment)} {}

SpanReader::~SpanReader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (helper_.joinable()) helper_.join();
}

absl::StatusOr<SpanReader::Span> SpanReader::Read(const MappedFile& source, uint64_t begin,
                                                  uint64_t end, int buffer, bool direct) const {
  std::byte* into = reinterpret_cast<std::byte*>(buffers_[buffer].data());
  Span span{&source, begin, end, nullptr, buffer, direct};
  if (direct && source.direct_reads()) {
    ASSIGN_OR_RETURN(span.data, source.ReadDirect(begin, end - begin, into));
  } else {
    RETURN_IF_ERROR(source.ReadAt(begin, end - begin, into));
    span.data = into;
  }
  return span;
}

void SpanReader::HelperLoop() {
  while (true) {
    Span wanted;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SpanReader::HelperHasWork));
      if (stopping_) return;
      wanted = ahead_;
    }
    absl::StatusOr<Span> read =
        Read(*wanted.source, wanted.begin, wanted.end, wanted.buffer, wanted.direct);
    absl::MutexLock lock(&mu_);
    ahead_status_ = read.status();
    if (read.ok()) ahead_ = *read;
    done_ = true;
  }
}

int SpanReader::FreeBuffer() {
  // Spans take turns in buffers 0 and 1, and 3 too for files written in turns, where the
  // previous span then survives a read ahead. Buffer 2 is the side buffer.
  for (int buffer : {0, 1, kThirdBuffer}) {
    if (buffer == kThirdBuffer && !in_turns_) break;
    if (buffer == current_.buffer) continue;
    if (buffer == previous_.buffer && previous_.data != nullptr) {
      if (in_turns_) continue;
      previous_ = Span();
    }
    return buffer;
  }
  return 1 - current_.buffer;  // not reached: one of three is neither
}

absl::StatusOr<SpanReader::Bytes> SpanReader::Get(const std::vector<MappedFile>& sources, int file,
                                                  uint64_t offset, uint64_t length, uint64_t limit,
                                                  const Run* next, bool direct, uint64_t lead) {
  const MappedFile* const source = &sources[file];
  if (current_.Holds(source, offset, length)) {
    return Bytes{current_.data + (offset - current_.begin), current_.end - offset};
  }
  if (previous_.Holds(source, offset, length)) {
    // Output files written in turns (file_writer.cc, WriteInLockstep) come back to the span before
    // the one the first of them moved on to: the other parts' strips of the same rows.
    return Bytes{previous_.data + (offset - previous_.begin), previous_.end - offset};
  }
  if (in_turns_) {
    if (side_.Holds(source, offset, length)) {
      return Bytes{side_.data + (offset - side_.begin), side_.end - offset};
    }
    const uint64_t end = std::max(offset + length, std::min(limit, source->size()));
    if (end - offset <= kSideBytes) {
      side_ = Span();
      ASSIGN_OR_RETURN(side_, Read(*source, offset, end, /*buffer=*/2, direct));
      ++reads_waited_;
      bytes_read_ += end - offset;
      return Bytes{side_.data, side_.end - offset};
    }
  }
  const Span last = current_;
  bool from_ahead = false;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &SpanReader::AheadIdle));  // its buffer is free after
    if (requested_ && ahead_status_.ok() && ahead_.Holds(source, offset, length)) {
      current_ = ahead_;
      from_ahead = true;
    } else if (requested_) {
      ++reads_ahead_unused_;
    }
    requested_ = false;
    done_ = false;
  }
  // A remote source whose next run continues this one in the same file is read in whole spans,
  // not cut at the run's limit: every read is a request with a round trip, and a consolidation
  // reads its files front to back, so short tensors share one request. The next run may start
  // a few bytes on (ContinuesAfter): a torch.save archive's records are apart by a data
  // descriptor and a local header. Runs that take turns with other files' (the chunks of a
  // tensor merged by columns) are still cut, as they would otherwise be read again for every
  // window.
  const bool continues = next != nullptr && next->file == file && ContinuesAfter(*next, limit);
  const uint64_t read_limit = !source->mapped() && continues ? source->size() : limit;
  if (from_ahead) {
    ++reads_ahead_used_;
  } else {
    // The lead is kept short of the whole span: the request must fit behind it.
    const uint64_t begin = offset - std::min({offset, lead, capacity_ / 2});
    const uint64_t end =
        std::max(offset + length, std::min<uint64_t>(read_limit, begin + capacity_));
    // Into a free buffer: the read ahead, if one was asked for, is over and unused.
    const int buffer = FreeBuffer();
    current_.data = nullptr;  // until the read succeeds
    ASSIGN_OR_RETURN(current_, Read(*source, begin, end, buffer, direct));
    ++reads_waited_;
    bytes_read_ += end - begin;
  }
  previous_ = last;  // until a read takes its buffer (FreeBuffer)
  // What the caller reads next, read while this span is consumed (the kernel reads ahead for
  // buffered sources).
  const MappedFile* ahead_source = source;
  bool ahead_direct = direct;
  uint64_t ahead_begin = std::max(current_.begin, current_.end - std::min(current_.end, overlap()));
  uint64_t ahead_end = std::min(source->size(), ahead_begin + capacity_);
  if (next != nullptr) {
    const bool next_known = next->file >= 0 && static_cast<size_t>(next->file) < sources.size();
    if (current_.end < limit) {
      ahead_end = std::min(ahead_end, read_limit);
    } else if (next_known && &sources[next->file] == source && !source->mapped() &&
               next->offset >= current_.begin && next->offset <= current_.end + overlap()) {
      // The next run starts in this (whole) span or a few bytes after it (ContinuesAfter): the
      // span after it, as without `next`, which holds it.
    } else if (next_known) {
      ahead_source = &sources[next->file];
      ahead_direct = ahead_source->ReadsDirectly(next->dense, next->offset, next->limit);
      ahead_begin = next->offset;
      ahead_end = std::min({ahead_source->size(), next->limit, next->offset + capacity_});
    } else {
      ahead_end = ahead_begin;  // nothing follows
    }
  }
  if (ahead_direct && ahead_source->direct_reads() && ahead_begin < ahead_end &&
      !(ahead_source == source && ahead_end <= current_.end)) {
    // Started at the first read ahead: buffered sources never need it.
    if (!helper_.joinable()) helper_ = std::thread([this] { HelperLoop(); });
    const int buffer = FreeBuffer();
    absl::MutexLock lock(&mu_);
    ahead_ = Span{ahead_source, ahead_begin, ahead_end, nullptr, buffer, true};
    ahead_status_ = absl::OkStatus();
    requested_ = true;
    done_ = false;
    bytes_read_ += ahead_end - ahead_begin;
  }
  return Bytes{current_.data + (offset - current_.begin), current_.end - offset};
}

}  // namespace reshard
