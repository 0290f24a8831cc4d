// The zip container of torch.save files, read without trusting any size in it.
//
// torch.save writes a stored (uncompressed) zip with ZIP64 end records, every entry under one
// top folder ("<top>/data.pkl", "<top>/data/0", ...), payloads 64-byte aligned behind an "FB"
// padding extra field in the local header. This reader finds the end of central directory
// (classic, then ZIP64), reads the central directory, and locates each entry's payload through
// its local header, checking every offset and size against the file. Compressed entries are
// listed but flagged, since their bytes cannot be mapped.

#ifndef RESHARD_LIB_FORMATS_TORCH_ZIP_ARCHIVE_H_
#define RESHARD_LIB_FORMATS_TORCH_ZIP_ARCHIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

struct ZipEntry {
  std::string name;          // full name, e.g. "ckpt/data/0"
  uint64_t data_offset = 0;  // where the payload starts in the file
  uint64_t size = 0;         // payload bytes (uncompressed size)
  uint64_t compressed_size = 0;
  uint16_t method = 0;  // 0 = stored
  uint32_t crc32 = 0;
};

class ZipArchive {
 public:
  // Limits on untrusted archives.
  static constexpr uint64_t kMaxEntries = 1'000'000;
  static constexpr uint64_t kMaxCentralDirectoryBytes = 512ull << 20;

  // Parses the archive in `bytes`, a read-only view of the whole file of `path` (for messages).
  // DataLoss naming the file and byte offset on any inconsistency.
  static absl::StatusOr<ZipArchive> Parse(absl::string_view bytes, absl::string_view path);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  // The top folder shared by all entries ("ckpt" for "ckpt/data.pkl").
  const std::string& top() const { return top_; }
  // The entry "<top>/<name>", or nullptr.
  const ZipEntry* Find(absl::string_view name_below_top) const;

 private:
  std::vector<ZipEntry> entries_;
  std::string top_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_ZIP_ARCHIVE_H_
