// Zip archives written byte by byte for tests, laid out as torch.save writes them
// (PyTorchStreamWriter on miniz): stored entries, each local header followed by an "FB" extra
// field that pads the payload to a 64-byte boundary, a data descriptor after each non-empty
// payload, then the central directory, a ZIP64 end record and locator, and the classic end
// record. Options switch the torch-specific parts off, and an entry can claim a compression
// method, a different uncompressed size or a ZIP64 extra field, for tests of readers that must
// locate or refuse such entries. `Built` gives the offset of every structure, so a test can
// assert where a payload is or corrupt one field in place.
//
// testonly: nothing here is checked; it writes whatever it is asked to.

#ifndef RESHARD_LIB_TESTING_ZIP_BUILDER_H_
#define RESHARD_LIB_TESTING_ZIP_BUILDER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace reshard {
namespace zip_testing {

// One archive member, written in the order given.
struct Entry {
  std::string name;     // the full name, top folder included ("archive/data/0")
  std::string data;     // the payload as written (for method != 0, the "compressed" bytes as is)
  uint16_t method = 0;  // 0 stored, 8 deflate (only recorded; `data` is not compressed)
  // The uncompressed size written into the central directory; UINT64_MAX: data.size().
  uint64_t uncompressed_size = UINT64_MAX;
  // Write saturated 32-bit sizes and offset plus a ZIP64 extra field (0x0001) in the central
  // directory.
  bool zip64_extra = false;
  // The CRC-32 written for the entry; unset: the CRC-32 of `data`, as zlib computes it.
  std::optional<uint32_t> crc32;
};

struct Options {
  bool zip64_end = true;    // ZIP64 end record + locator before the classic end record (as torch)
  bool fb_padding = true;   // the "FB" extra field that aligns payloads (as torch)
  uint64_t alignment = 64;  // payload alignment with fb_padding
  std::string comment;      // archive comment after the classic end record
};

// The archive and where its parts are (byte offsets into `bytes`).
struct Built {
  std::string bytes;
  std::vector<uint64_t> local;    // each entry's local header
  std::vector<uint64_t> payload;  // each entry's payload
  std::vector<uint64_t> central;  // each entry's central directory record
  uint64_t cd_offset = 0;         // the central directory
  uint64_t cd_size = 0;
  uint64_t zip64_end = 0;  // the ZIP64 end record (0 without one)
  uint64_t locator = 0;    // the ZIP64 end locator (0 without one)
  uint64_t eocd = 0;       // the classic end of central directory record
};

// Writes `entries` as PyTorchStreamWriter + miniz lay them out (see the file comment), with
// each entry's CRC-32 (Entry::crc32).
Built BuildZip(const std::vector<Entry>& entries, const Options& options = {});

}  // namespace zip_testing
}  // namespace reshard

#endif  // RESHARD_LIB_TESTING_ZIP_BUILDER_H_
