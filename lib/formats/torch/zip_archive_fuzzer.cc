// libFuzzer target: the torch.save zip container reader must never crash, hang or read out of
// bounds, and every entry it accepts must lie inside the input.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "lib/formats/torch/zip_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto archive = reshard::ZipArchive::Parse(bytes, "fuzz.pt");
  if (!archive.ok()) return 0;
  if (archive->entries().empty()) std::abort();  // (top may be "" for "/data.pkl")
  for (const reshard::ZipEntry& entry : archive->entries()) {
    if (entry.data_offset > size || entry.compressed_size > size - entry.data_offset) std::abort();
    if (entry.method == 0 && entry.size != entry.compressed_size) std::abort();
    // Touch the payload: ASan reports any byte outside the input.
    volatile uint8_t sink = 0;
    if (entry.compressed_size > 0) {
      sink ^= data[entry.data_offset];
      sink ^= data[entry.data_offset + entry.compressed_size - 1];
    }
  }
  (void)archive->Find("data.pkl");
  return 0;
}
