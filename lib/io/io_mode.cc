#include "lib/io/io_mode.h"

#include "absl/strings/str_cat.h"

namespace reshard {

absl::string_view IoModeName(IoMode mode) {
  switch (mode) {
    case IoMode::kAuto:
      return "auto";
    case IoMode::kDirect:
      return "direct";
    case IoMode::kBuffered:
      return "buffered";
  }
  return "auto";
}

absl::StatusOr<IoMode> ParseIoMode(absl::string_view name) {
  for (IoMode mode : {IoMode::kAuto, IoMode::kDirect, IoMode::kBuffered}) {
    if (name == IoModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("I/O mode must be auto, direct or buffered, got \"", name, "\""));
}

}  // namespace reshard
