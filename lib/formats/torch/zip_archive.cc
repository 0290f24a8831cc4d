#include "lib/formats/torch/zip_archive.h"

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

// Bounds-checked little-endian reads from the file.
class Bytes {
 public:
  Bytes(absl::string_view data, absl::string_view path) : data_(data), path_(path) {}

  bool Has(uint64_t offset, uint64_t length) const {
    return offset <= data_.size() && length <= data_.size() - offset;
  }
  absl::Status Need(uint64_t offset, uint64_t length, absl::string_view what) const {
    if (Has(offset, length)) return absl::OkStatus();
    return Error(offset, absl::StrCat(what, " (", length, " bytes) runs past the end of the file (",
                                      data_.size(), " bytes)"));
  }
  uint16_t U16(uint64_t offset) const { return absl::little_endian::Load16(data_.data() + offset); }
  uint32_t U32(uint64_t offset) const { return absl::little_endian::Load32(data_.data() + offset); }
  uint64_t U64(uint64_t offset) const { return absl::little_endian::Load64(data_.data() + offset); }
  absl::string_view Slice(uint64_t offset, uint64_t length) const {
    return data_.substr(offset, length);
  }
  uint64_t size() const { return data_.size(); }
  absl::Status Error(uint64_t offset, absl::string_view message) const {
    return absl::DataLossError(
        absl::StrCat(path_, ": zip archive: ", message, " at byte offset ", offset));
  }

 private:
  absl::string_view data_;
  absl::string_view path_;
};

// ZIP64 extended information of a central directory entry: replaces the fields that were
// saturated at 0xFFFFFFFF, in the fixed order uncompressed, compressed, local header offset.
absl::Status ApplyZip64Extra(const Bytes& bytes, uint64_t extra, uint64_t extra_length,
                             uint64_t* size, uint64_t* compressed, uint64_t* local_offset) {
  uint64_t at = extra;
  const uint64_t end = extra + extra_length;
  while (at + 4 <= end) {
    const uint16_t id = bytes.U16(at);
    const uint16_t length = bytes.U16(at + 2);
    if (at + 4 + length > end) return bytes.Error(at, "extra field overruns its entry");
    if (id == 0x0001) {
      uint64_t field = at + 4;
      const uint64_t field_end = field + length;
      for (uint64_t* value : {size, compressed, local_offset}) {
        if (*value != 0xFFFFFFFFu) continue;
        if (field + 8 > field_end) return bytes.Error(at, "ZIP64 extra field is too short");
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

absl::StatusOr<ZipArchive> ZipArchive::Parse(absl::string_view data, absl::string_view path) {
  const Bytes bytes(data, path);
  if (bytes.size() < kEndSize) return bytes.Error(0, "file too short for a zip archive");
  // The classic end record sits at the end, before a comment of at most 64 KiB.
  uint64_t end_record = UINT64_MAX;
  const uint64_t lowest = bytes.size() > kEndSize + 0xFFFF ? bytes.size() - kEndSize - 0xFFFF : 0;
  for (uint64_t at = bytes.size() - kEndSize + 1; at-- > lowest;) {
    if (bytes.U32(at) == kEndSignature && at + kEndSize + bytes.U16(at + 20) == bytes.size()) {
      end_record = at;
      break;
    }
  }
  if (end_record == UINT64_MAX) {
    return bytes.Error(bytes.size(), "no end of central directory record (truncated file?)");
  }
  uint64_t entries = bytes.U16(end_record + 10);
  uint64_t cd_size = bytes.U32(end_record + 12);
  uint64_t cd_offset = bytes.U32(end_record + 16);
  // torch always writes ZIP64 end records; they hold the real counts and offsets.
  if (end_record >= kZip64LocatorSize &&
      bytes.U32(end_record - kZip64LocatorSize) == kZip64LocatorSignature) {
    const uint64_t locator = end_record - kZip64LocatorSize;
    const uint64_t zip64_end = bytes.U64(locator + 8);
    RETURN_IF_ERROR(bytes.Need(zip64_end, kZip64EndSize, "ZIP64 end of central directory"));
    if (bytes.U32(zip64_end) != kZip64EndSignature) {
      return bytes.Error(zip64_end, "bad ZIP64 end of central directory signature");
    }
    entries = bytes.U64(zip64_end + 32);
    cd_size = bytes.U64(zip64_end + 40);
    cd_offset = bytes.U64(zip64_end + 48);
  }
  if (entries > kMaxEntries) {
    return bytes.Error(end_record, absl::StrCat("archive claims ", entries, " entries (at most ",
                                                kMaxEntries, ")"));
  }
  if (cd_size > kMaxCentralDirectoryBytes) {
    return bytes.Error(end_record, absl::StrCat("central directory of ", cd_size, " bytes"));
  }
  RETURN_IF_ERROR(bytes.Need(cd_offset, cd_size, "central directory"));

  ZipArchive archive;
  archive.entries_.reserve(static_cast<size_t>(entries));
  uint64_t at = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + kCentralHeaderSize > cd_end) return bytes.Error(at, "central directory is truncated");
    if (bytes.U32(at) != kCentralHeaderSignature) {
      return bytes.Error(at, "bad central directory entry signature");
    }
    ZipEntry entry;
    entry.method = bytes.U16(at + 10);
    entry.crc32 = bytes.U32(at + 16);
    entry.compressed_size = bytes.U32(at + 20);
    entry.size = bytes.U32(at + 24);
    const uint64_t name_length = bytes.U16(at + 28);
    const uint64_t extra_length = bytes.U16(at + 30);
    const uint64_t comment_length = bytes.U16(at + 32);
    uint64_t local_offset = bytes.U32(at + 42);
    const uint64_t next = at + kCentralHeaderSize + name_length + extra_length + comment_length;
    if (next > cd_end) return bytes.Error(at, "central directory entry overruns the directory");
    entry.name = std::string(bytes.Slice(at + kCentralHeaderSize, name_length));
    RETURN_IF_ERROR(ApplyZip64Extra(bytes, at + kCentralHeaderSize + name_length, extra_length,
                                    &entry.size, &entry.compressed_size, &local_offset));
    // The payload starts after the local header, whose name and extra lengths may differ from
    // the central directory's (torch pads there).
    RETURN_IF_ERROR(bytes.Need(local_offset, kLocalHeaderSize,
                               absl::StrCat("local header of \"", entry.name, "\"")));
    if (bytes.U32(local_offset) != kLocalHeaderSignature) {
      return bytes.Error(local_offset,
                         absl::StrCat("bad local header signature for \"", entry.name, "\""));
    }
    entry.data_offset = local_offset + kLocalHeaderSize + bytes.U16(local_offset + 26) +
                        bytes.U16(local_offset + 28);
    RETURN_IF_ERROR(bytes.Need(entry.data_offset, entry.compressed_size,
                               absl::StrCat("data of \"", entry.name, "\"")));
    if (entry.method == 0 && entry.compressed_size != entry.size) {
      return bytes.Error(at, absl::StrCat("stored entry \"", entry.name,
                                          "\" has different compressed and uncompressed sizes"));
    }
    archive.by_name_.emplace(entry.name, archive.entries_.size());
    archive.entries_.push_back(std::move(entry));
    at = next;
  }
  if (archive.entries_.empty()) return bytes.Error(cd_offset, "archive has no entries");
  const std::string& first = archive.entries_[0].name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos) {
    return bytes.Error(cd_offset, absl::StrCat("first entry \"", first, "\" is not in a folder"));
  }
  archive.top_ = first.substr(0, slash);
  return archive;
}

const ZipEntry* ZipArchive::Find(absl::string_view name_below_top) const {
  auto it = by_name_.find(absl::StrCat(top_, "/", name_below_top));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

}  // namespace reshard
