#include "lib/io/crc32_source.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/crc32.h"

namespace reshard {
namespace {

// Bytes Verify reads at a time to fill a gap.
constexpr uint64_t kGapChunk = 4 << 20;

}  // namespace

Crc32Source::Crc32Source(const std::vector<ChecksummedRange>& ranges, FragmentBudget* budget)
    : budget_(budget) {
  std::vector<const ChecksummedRange*> sorted;
  for (const ChecksummedRange& range : ranges) sorted.push_back(&range);
  std::sort(
      sorted.begin(), sorted.end(),
      [](const ChecksummedRange* a, const ChecksummedRange* b) { return a->offset < b->offset; });
  uint64_t reach = 0;
  for (const ChecksummedRange* range : sorted) {
    ranges_.push_back(std::make_unique<Range>());
    ranges_.back()->range = *range;
    reach = std::max(reach, range->offset + range->length);
    reach_.push_back(reach);
  }
}

uint64_t Crc32Source::MemoryBound(const std::vector<SourceFile>& sources) {
  // A std::map node holds the key, the fragment and three pointers plus a colour.
  constexpr uint64_t kFragmentBytes = sizeof(uint64_t) + sizeof(Fragment) + 4 * sizeof(void*);
  uint64_t bytes = 0;
  bool any = false;
  for (const SourceFile& source : sources) {
    if (source.checksummed.empty()) continue;
    bytes += sizeof(Crc32Source);
    for (const ChecksummedRange& range : source.checksummed) {
      bytes += sizeof(Range) + sizeof(std::unique_ptr<Range>) + sizeof(uint64_t) +
               range.name.capacity();
      any = true;
    }
  }
  return any ? bytes + kMaxFragments * kFragmentBytes : bytes;
}

void Crc32Source::Read(uint64_t offset, uint64_t length, const std::byte* data) {
  if (ranges_.empty() || length == 0) return;
  const uint64_t end = offset + length;
  // Ranges are sorted by start; `reach_[i]` is the furthest end among the first i + 1, so the
  // walk down from the last range starting before `end` stops at the first that cannot
  // overlap (one step when ranges are disjoint, as torch.save writes them).
  auto after = std::lower_bound(
      ranges_.begin(), ranges_.end(), end,
      [](const std::unique_ptr<Range>& range, uint64_t at) { return range->range.offset < at; });
  for (size_t i = after - ranges_.begin(); i-- > 0 && reach_[i] > offset;) {
    Range& range = *ranges_[i];
    const uint64_t from = std::max(offset, range.range.offset);
    const uint64_t to = std::min(end, range.range.offset + range.range.length);
    if (to <= from) continue;
    Add(range, from, to - from, data == nullptr ? nullptr : data + (from - offset));
  }
}

void Crc32Source::Add(Range& range, uint64_t offset, uint64_t length, const std::byte* data) {
  const uint64_t end = offset + length;
  // The parts of the run no fragment covers yet. Runs overlap where the pass reads bytes
  // twice: a span read ahead starts a direct-read block before the end of the one before it
  // (SpanReader::overlap), a replicated tensor is read by several parts, a span is read again.
  // Those bytes are accounted for once; the rest of the run still counts, else Verify would
  // read it again.
  std::vector<ByteRange> uncovered;
  {
    absl::MutexLock lock(&range.mu);
    range.read = true;
    if (data == nullptr) return;
    const std::map<uint64_t, Fragment>& fragments = range.fragments;
    uint64_t at = offset;
    auto fragment = fragments.upper_bound(offset);
    if (fragment != fragments.begin()) {
      auto previous = std::prev(fragment);
      at = std::max(at, previous->first + previous->second.length);
    }
    for (; fragment != fragments.end() && fragment->first < end && at < end; ++fragment) {
      if (fragment->first > at) uncovered.push_back({at, fragment->first - at});
      at = std::max(at, fragment->first + fragment->second.length);
    }
    if (at < end) uncovered.push_back({at, end - at});
  }
  // Their CRC-32s are computed outside the lock, while the bytes are hot.
  for (const ByteRange& part : uncovered) {
    Insert(range, part.offset, part.length, Crc32(0, data + (part.offset - offset), part.length));
  }
}

void Crc32Source::Insert(Range& range, uint64_t offset, uint64_t length, uint32_t crc) {
  const uint64_t end = offset + length;
  absl::MutexLock lock(&range.mu);
  std::map<uint64_t, Fragment>& fragments = range.fragments;
  auto next = fragments.upper_bound(offset);
  auto previous = next == fragments.begin() ? fragments.end() : std::prev(next);
  // Another thread covered some of these bytes since Add looked: the part is left to Verify.
  if (previous != fragments.end() && previous->first + previous->second.length > offset) return;
  if (next != fragments.end() && next->first < end) return;
  std::map<uint64_t, Fragment>::iterator current;
  if (previous != fragments.end() && previous->first + previous->second.length == offset) {
    previous->second.crc32 = Crc32Combine(previous->second.crc32, crc, length);
    previous->second.length += length;
    current = previous;
  } else if (next != fragments.end() && next->first == end) {
    // Prepending to the next fragment keeps the count.
    const Fragment merged{length + next->second.length,
                          Crc32Combine(crc, next->second.crc32, next->second.length)};
    fragments.erase(next);
    fragments.emplace(offset, merged);
    return;
  } else {
    if (fragments.size() >= kMaxFragmentsPerRange || budget_->load() >= kMaxFragments) {
      return;  // left to Verify's reads
    }
    current = fragments.emplace(offset, Fragment{length, crc}).first;
    budget_->fetch_add(1);
  }
  if (next != fragments.end() && next->first == current->first + current->second.length) {
    current->second.crc32 =
        Crc32Combine(current->second.crc32, next->second.crc32, next->second.length);
    current->second.length += next->second.length;
    fragments.erase(next);
    budget_->fetch_sub(1);
  }
}

absl::Status Crc32Source::Verify(
    const MappedFile& file,
    const std::function<std::string(const ChecksummedRange&)>& context) const {
  if (file.read_stage() == this) {
    return absl::InternalError(absl::StrCat(file.path(), ": CRC-32 check while still attached"));
  }
  for (const std::unique_ptr<Range>& range : ranges_) {
    RETURN_IF_ERROR(VerifyRange(file, *range, context));
  }
  return absl::OkStatus();
}

absl::Status Crc32Source::VerifyRange(
    const MappedFile& file, const Range& range,
    const std::function<std::string(const ChecksummedRange&)>& context) const {
  absl::MutexLock lock(&range.mu);
  if (!range.read) return absl::OkStatus();
  const ChecksummedRange& expected = range.range;
  std::vector<std::byte> buffer;
  uint32_t crc = 0;
  // Extends `crc` over bytes [from, to) read from the file.
  auto read_gap = [&](uint64_t from, uint64_t to) -> absl::Status {
    if (to <= from) return absl::OkStatus();
    buffer.resize(static_cast<size_t>(std::min(kGapChunk, expected.length)));
    for (uint64_t at = from; at < to;) {
      const uint64_t n = std::min<uint64_t>(buffer.size(), to - at);
      RETURN_IF_ERROR(file.ReadAt(at, static_cast<size_t>(n), buffer.data()));
      crc = Crc32(crc, buffer.data(), n);
      at += n;
    }
    bytes_reread_.fetch_add(to - from);
    return absl::OkStatus();
  };
  uint64_t cursor = expected.offset;
  for (const auto& [offset, fragment] : range.fragments) {
    RETURN_IF_ERROR(read_gap(cursor, offset));
    crc = Crc32Combine(crc, fragment.crc32, fragment.length);
    cursor = offset + fragment.length;
  }
  RETURN_IF_ERROR(read_gap(cursor, expected.offset + expected.length));
  if (crc == expected.crc32) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      file.path(), ": ", expected.name, " (", expected.length, " bytes at byte offset ",
      expected.offset, ") has CRC-32 ", absl::Hex(crc, absl::kZeroPad8), " but the file records ",
      absl::Hex(expected.crc32, absl::kZeroPad8), context ? context(expected) : ""));
}

}  // namespace reshard
