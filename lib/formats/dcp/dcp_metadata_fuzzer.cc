// libFuzzer target: a DCP `.metadata` pickle must be interpreted (or refused) without crashing,
// hanging or allocating beyond the limits, and whatever is accepted must be consistent: every
// chunk inside rank bounds of its tensor, one storage entry per chunk.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "lib/formats/dcp/dcp_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  reshard::DcpLimits limits;
  limits.max_entries = 4096;
  limits.max_chunks = 65536;
  auto metadata = reshard::ParseDcpMetadata(bytes, "fuzz/.metadata", limits);
  if (!metadata.ok()) return 0;
  if (static_cast<int64_t>(metadata->entries.size()) > limits.max_entries) std::abort();
  for (const reshard::DcpEntry& entry : metadata->entries) {
    if (!entry.is_tensor) {
      if (entry.storage.size() != 1) std::abort();
      continue;
    }
    if (entry.chunks.size() != entry.storage.size()) std::abort();
    std::vector<reshard::Box> boxes;
    for (const reshard::Box& chunk : entry.chunks) {
      if (chunk.origin.size() != entry.size.size()) std::abort();
      boxes.push_back(chunk);
    }
    (void)reshard::CheckChunkTiling(entry.size, boxes);
  }
  return 0;
}
