// The safetensors header: parsing and validation of every rule of the format.
//
// Layout: u64 little-endian N, then N bytes of UTF-8 JSON, then the data buffer. The JSON maps
// tensor names to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the
// buffer) plus an optional "__metadata__" map of strings. Validation follows the reference
// implementation: N <= 100,000,000 and inside the file; valid UTF-8 JSON of that schema;
// known dtypes; offsets contiguous from 0 with no holes or overlaps; shape x dtype size = byte
// length (overflow checked); the last tensor ends exactly at the end of the file. Duplicate
// keys are rejected too (the format forbids them). Nothing in the header is trusted before it
// is checked; every error says what is wrong and where.

#ifndef RESHARD_LIB_FORMATS_SAFETENSORS_HEADER_H_
#define RESHARD_LIB_FORMATS_SAFETENSORS_HEADER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"

namespace reshard {

inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsTensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // relative to the data buffer
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_length = 0;  // N
  uint64_t data_start = 0;     // 8 + N: where the data buffer starts in the file
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensorEntry> tensors;  // sorted by data offset
};

// Validates the length prefix `prefix8` (the file's first 8 bytes, or fewer if the file is
// shorter) against `file_size` and returns N. DataLoss on a short file or a bad length.
absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view prefix8,
                                                      uint64_t file_size);

// Parses and validates the JSON header `json` (N bytes) of a file of `file_size` bytes.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeaderJson(absl::string_view json,
                                                             uint64_t file_size);

// Both steps on an in-memory file prefix that holds at least 8 + N bytes (or the whole file).
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file_prefix,
                                                         uint64_t file_size);

// Reads and validates the header of the file at `path` (reads only 8 + N bytes). Errors are
// prefixed with the path. Sets `*file_size`, and `*version` when given (MappedFile::version:
// a remote file's ETag, empty for a local file).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path,
                                                        uint64_t* file_size,
                                                        std::string* version = nullptr);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_SAFETENSORS_HEADER_H_
