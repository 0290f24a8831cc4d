// The zip container of torch.save files, read without trusting any size in it.
//
// torch.save writes a stored (uncompressed) zip with ZIP64 end records, every entry under one
// top folder ("<top>/data.pkl", "<top>/data/0", ...), payloads 64-byte aligned behind an "FB"
// padding extra field in the local header. This reader finds the end of central directory
// (classic, then ZIP64), reads the central directory, and locates each entry's payload through
// its local header, checking every offset and size against the file. Compressed entries are
// listed but flagged, since their bytes cannot be mapped.
//
// The bytes come from a ByteSource (lib/io/byte_source.h): a view of a mapped local file, or
// range reads of a remote one. The reader asks for exactly what it parses, in this order: the
// file's last kTailBytes (the end records, and the central directory of all but very large
// archives), the ZIP64 end record and the central directory when they lie before that tail,
// then every local header at once (one Prefetch, so a remote source reads neighbouring headers
// with one request and the others several at a time) together with the payloads the caller
// names in `ParseOptions::prefetch_payloads` (data.pkl). Its metadata costs a remote file a
// handful of range reads, however many entries it has.

#ifndef RESHARD_LIB_FORMATS_TORCH_ZIP_ARCHIVE_H_
#define RESHARD_LIB_FORMATS_TORCH_ZIP_ARCHIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/byte_source.h"

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
  // The end of the file read first: more than the classic end record with the longest comment
  // (22 + 65535 bytes) and the ZIP64 locator before it.
  static constexpr uint64_t kTailBytes = 256 << 10;

  struct ParseOptions {
    // Entries (names below the top folder, "data.pkl") whose payloads are read with the local
    // headers: the caller reads them next (ByteSource::Read of data_offset, size).
    std::vector<std::string> prefetch_payloads;
    // The end of the file read first (capped at kTailBytes). A shorter one suits many small
    // archives read together, whose callers prefetched their ends (DCP chunks: torch.save
    // writes no comment, so the end records and a short central directory lie in the last
    // few KiB); when the end records do not lie inside it, the last kTailBytes are read.
    // Default: kTailBytes.
    uint64_t tail_bytes = kTailBytes;
  };

  // Parses the archive in `source` (the whole file; its path names it in messages). DataLoss
  // naming the file and byte offset on any inconsistency; a failed read's error, annotated
  // with what was read.
  static absl::StatusOr<ZipArchive> Parse(ByteSource& source, const ParseOptions& options);
  // The same for `bytes`, a read-only view of the whole file of `path`.
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
