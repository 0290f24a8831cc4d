#include "lib/testing/fuzz_sources.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace reshard {

std::unique_ptr<RangeReadSource> SmallWindowRangeReads(const uint8_t* data, size_t size,
                                                       std::string path) {
  RangeReadOptions options;
  options.merge_gap = 64;
  options.max_read = 256;
  options.reads_in_flight = 2;
  return std::make_unique<RangeReadSource>(
      std::move(path), size,
      [data, size](uint64_t offset, absl::Span<char> out) {
        if (offset > size || out.size() > size - offset) std::abort();  // a read past the end
        if (!out.empty()) std::memcpy(out.data(), data + offset, out.size());
        return absl::OkStatus();
      },
      options);
}

}  // namespace reshard
