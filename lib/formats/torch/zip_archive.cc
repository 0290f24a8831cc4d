#include "lib/formats/torch/zip_archive.h"

#include <algorithm>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint64_t kEndSize = 22;
constexpr uint64_t kZip64LocatorSize = 20;
constexpr uint64_t kZip64EndSize = 56;
constexpr uint64_t kCentralHeaderSize = 46;
constexpr uint64_t kLocalHeaderSize = 30;

// Room for the local header's name and extra fields beyond the central directory's when a
// payload is prefetched with its header (torch pads the local extra field to 64 bytes).
constexpr uint64_t kLocalHeaderSlack = 128;

// Bytes of the file loaded from the source: little-endian reads at file offsets inside it.
class Region {
 public:
  Region(absl::string_view bytes, uint64_t base) : bytes_(bytes), base_(base) {}
  uint16_t U16(uint64_t offset) const { return absl::little_endian::Load16(At(offset)); }
  uint32_t U32(uint64_t offset) const { return absl::little_endian::Load32(At(offset)); }
  uint64_t U64(uint64_t offset) const { return absl::little_endian::Load64(At(offset)); }
  absl::string_view Slice(uint64_t offset, uint64_t length) const {
    return bytes_.substr(offset - base_, length);
  }

 private:
  const char* At(uint64_t offset) const { return bytes_.data() + (offset - base_); }
  absl::string_view bytes_;
  uint64_t base_;
};

// The file: its bounds, errors naming it, and regions loaded from it.
class File {
 public:
  explicit File(ByteSource& source) : source_(source) {}

  uint64_t size() const { return source_.size(); }
  bool Has(uint64_t offset, uint64_t length) const {
    return offset <= size() && length <= size() - offset;
  }
  absl::Status Need(uint64_t offset, uint64_t length, absl::string_view what) const {
    if (Has(offset, length)) return absl::OkStatus();
    return Error(offset, absl::StrCat(what, " (", length, " bytes) runs past the end of the file (",
                                      size(), " bytes)"));
  }
  // The bytes [offset, offset + length), checked with Need first.
  absl::StatusOr<Region> Load(uint64_t offset, uint64_t length, absl::string_view what) const {
    RETURN_IF_ERROR(Need(offset, length, what));
    ASSIGN_OR_RETURN(absl::string_view bytes, source_.Read(offset, length, what),
                     absl::StrCat(source_.path(), ": zip archive"));
    return Region(bytes, offset);
  }
  absl::Status Prefetch(std::vector<ByteRange> ranges) const {
    return Annotate(source_.Prefetch(std::move(ranges)),
                    absl::StrCat(source_.path(), ": zip archive: local headers"));
  }
  absl::Status Error(uint64_t offset, absl::string_view message) const {
    return absl::DataLossError(
        absl::StrCat(source_.path(), ": zip archive: ", message, " at byte offset ", offset));
  }

 private:
  ByteSource& source_;
};

// ZIP64 extended information of a central directory entry: replaces the fields that were
// saturated at 0xFFFFFFFF, in the fixed order uncompressed, compressed, local header offset.
absl::Status ApplyZip64Extra(const File& file, const Region& bytes, uint64_t extra,
                             uint64_t extra_length, uint64_t* size, uint64_t* compressed,
                             uint64_t* local_offset) {
  uint64_t at = extra;
  const uint64_t end = extra + extra_length;
  while (at + 4 <= end) {
    const uint16_t id = bytes.U16(at);
    const uint16_t length = bytes.U16(at + 2);
    if (at + 4 + length > end) return file.Error(at, "extra field overruns its entry");
    if (id == 0x0001) {
      uint64_t field = at + 4;
      const uint64_t field_end = field + length;
      for (uint64_t* value : {size, compressed, local_offset}) {
        if (*value != 0xFFFFFFFFu) continue;
        if (field + 8 > field_end) return file.Error(at, "ZIP64 extra field is too short");
        *value = bytes.U64(field);
        field += 8;
      }
      return absl::OkStatus();
    }
    at += 4 + length;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ZipArchive> ZipArchive::Parse(absl::string_view bytes, absl::string_view path) {
  ViewByteSource source(bytes, std::string(path));
  return Parse(source, ParseOptions());
}

absl::StatusOr<ZipArchive> ZipArchive::Parse(ByteSource& source, const ParseOptions& options) {
  const File file(source);
  const uint64_t size = file.size();
  if (size < kEndSize) return file.Error(0, "file too short for a zip archive");
  // The classic end record sits at the end, before a comment of at most 64 KiB; the ZIP64
  // locator right before it. Both lie in the tail.
  const uint64_t lowest = size > kEndSize + 0xFFFF ? size - kEndSize - 0xFFFF : 0;
  // The end record with the ZIP64 locator before it inside the tail `tail_start`; UINT64_MAX
  // when there is none there.
  auto find_end = [&](const Region& tail, uint64_t tail_start) {
    for (uint64_t at = size - kEndSize + 1; at-- > std::max(lowest, tail_start);) {
      if (tail.U32(at) == kEndSignature && at + kEndSize + tail.U16(at + 20) == size) {
        const bool locator_inside = tail_start == 0 || at >= tail_start + kZip64LocatorSize;
        return locator_inside ? at : UINT64_MAX;
      }
    }
    return UINT64_MAX;
  };
  uint64_t tail_start = size - std::min({size, kTailBytes, options.tail_bytes});
  ASSIGN_OR_RETURN(Region tail,
                   file.Load(tail_start, size - tail_start, "end of central directory"));
  uint64_t end_record = find_end(tail, tail_start);
  if (end_record == UINT64_MAX && tail_start > size - std::min(size, kTailBytes)) {
    tail_start = size - std::min(size, kTailBytes);
    ASSIGN_OR_RETURN(tail, file.Load(tail_start, size - tail_start, "end of central directory"));
    end_record = find_end(tail, tail_start);
  }
  if (end_record == UINT64_MAX) {
    return file.Error(size, "no end of central directory record (truncated file?)");
  }
  uint64_t entries = tail.U16(end_record + 10);
  uint64_t cd_size = tail.U32(end_record + 12);
  uint64_t cd_offset = tail.U32(end_record + 16);
  // torch always writes ZIP64 end records; they hold the real counts and offsets.
  if (end_record >= kZip64LocatorSize &&
      tail.U32(end_record - kZip64LocatorSize) == kZip64LocatorSignature) {
    const uint64_t locator = end_record - kZip64LocatorSize;
    const uint64_t zip64_end_offset = tail.U64(locator + 8);
    ASSIGN_OR_RETURN(const Region zip64_end,
                     file.Load(zip64_end_offset, kZip64EndSize, "ZIP64 end of central directory"));
    if (zip64_end.U32(zip64_end_offset) != kZip64EndSignature) {
      return file.Error(zip64_end_offset, "bad ZIP64 end of central directory signature");
    }
    entries = zip64_end.U64(zip64_end_offset + 32);
    cd_size = zip64_end.U64(zip64_end_offset + 40);
    cd_offset = zip64_end.U64(zip64_end_offset + 48);
  }
  if (entries > kMaxEntries) {
    return file.Error(end_record, absl::StrCat("archive claims ", entries, " entries (at most ",
                                               kMaxEntries, ")"));
  }
  if (cd_size > kMaxCentralDirectoryBytes) {
    return file.Error(end_record, absl::StrCat("central directory of ", cd_size, " bytes"));
  }
  ASSIGN_OR_RETURN(const Region cd, file.Load(cd_offset, cd_size, "central directory"));

  // The central directory first: every entry and where its local header is.
  ZipArchive archive;
  archive.entries_.reserve(static_cast<size_t>(entries));
  std::vector<uint64_t> local_offsets;
  local_offsets.reserve(static_cast<size_t>(entries));
  std::vector<ByteRange> headers;
  uint64_t at = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + kCentralHeaderSize > cd_end) return file.Error(at, "central directory is truncated");
    if (cd.U32(at) != kCentralHeaderSignature) {
      return file.Error(at, "bad central directory entry signature");
    }
    ZipEntry entry;
    entry.method = cd.U16(at + 10);
    entry.crc32 = cd.U32(at + 16);
    entry.compressed_size = cd.U32(at + 20);
    entry.size = cd.U32(at + 24);
    const uint64_t name_length = cd.U16(at + 28);
    const uint64_t extra_length = cd.U16(at + 30);
    const uint64_t comment_length = cd.U16(at + 32);
    uint64_t local_offset = cd.U32(at + 42);
    const uint64_t next = at + kCentralHeaderSize + name_length + extra_length + comment_length;
    if (next > cd_end) return file.Error(at, "central directory entry overruns the directory");
    entry.name = std::string(cd.Slice(at + kCentralHeaderSize, name_length));
    RETURN_IF_ERROR(ApplyZip64Extra(file, cd, at + kCentralHeaderSize + name_length, extra_length,
                                    &entry.size, &entry.compressed_size, &local_offset));
    if (entry.method == 0 && entry.compressed_size != entry.size) {
      return file.Error(at, absl::StrCat("stored entry \"", entry.name,
                                         "\" has different compressed and uncompressed sizes"));
    }
    // The local header, and the payload when the caller reads it next (its local name and
    // extra fields may be longer than the central directory's: then it is read again).
    ByteRange header{local_offset, kLocalHeaderSize};
    const size_t slash = entry.name.find('/');
    const absl::string_view below_top =
        absl::string_view(entry.name).substr(slash == std::string::npos ? 0 : slash + 1);
    if (std::find(options.prefetch_payloads.begin(), options.prefetch_payloads.end(), below_top) !=
        options.prefetch_payloads.end()) {
      header.length += name_length + extra_length + kLocalHeaderSlack + entry.compressed_size;
    }
    headers.push_back(header);
    local_offsets.push_back(local_offset);
    archive.entries_.push_back(std::move(entry));
    at = next;
  }
  if (archive.entries_.empty()) return file.Error(cd_offset, "archive has no entries");

  // Then the local headers, all loaded at once: the payload starts after the local header,
  // whose name and extra lengths may differ from the central directory's (torch pads there).
  RETURN_IF_ERROR(file.Prefetch(std::move(headers)));
  for (size_t i = 0; i < archive.entries_.size(); ++i) {
    ZipEntry& entry = archive.entries_[i];
    const uint64_t local_offset = local_offsets[i];
    ASSIGN_OR_RETURN(const Region header,
                     file.Load(local_offset, kLocalHeaderSize,
                               absl::StrCat("local header of \"", entry.name, "\"")));
    if (header.U32(local_offset) != kLocalHeaderSignature) {
      return file.Error(local_offset,
                        absl::StrCat("bad local header signature for \"", entry.name, "\""));
    }
    entry.data_offset = local_offset + kLocalHeaderSize + header.U16(local_offset + 26) +
                        header.U16(local_offset + 28);
    RETURN_IF_ERROR(file.Need(entry.data_offset, entry.compressed_size,
                              absl::StrCat("data of \"", entry.name, "\"")));
    archive.by_name_.emplace(entry.name, i);
  }
  const std::string& first = archive.entries_[0].name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos) {
    return file.Error(cd_offset, absl::StrCat("first entry \"", first, "\" is not in a folder"));
  }
  archive.top_ = first.substr(0, slash);
  return archive;
}

const ZipEntry* ZipArchive::Find(absl::string_view name_below_top) const {
  auto it = by_name_.find(absl::StrCat(top_, "/", name_below_top));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

}  // namespace reshard
