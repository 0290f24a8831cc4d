// libFuzzer target: the torch.save zip container reader must never crash, hang or read out of
// bounds, and every entry it accepts must lie inside the input. The same input is parsed a
// second time by range reads (RangeReadSource, as for a remote file, with small windows so that
// the prefetch merges and splits): both must agree, errors included.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/string_view.h"
#include "lib/formats/torch/zip_archive.h"
#include "lib/io/byte_source.h"
#include "lib/testing/fuzz_sources.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto archive = reshard::ZipArchive::Parse(bytes, "fuzz.pt");

  std::unique_ptr<reshard::RangeReadSource> source =
      reshard::SmallWindowRangeReads(data, size, "fuzz.pt");
  reshard::ZipArchive::ParseOptions parse_options;
  parse_options.prefetch_payloads = {"data.pkl"};
  auto sparse = reshard::ZipArchive::Parse(*source, parse_options);
  if (archive.ok() != sparse.ok()) std::abort();
  if (!archive.ok()) {
    if (archive.status() != sparse.status()) std::abort();
    return 0;
  }
  if (archive->entries().empty()) std::abort();  // (top may be "" for "/data.pkl")
  if (archive->entries().size() != sparse->entries().size()) std::abort();
  for (size_t i = 0; i < archive->entries().size(); ++i) {
    const reshard::ZipEntry& entry = archive->entries()[i];
    if (entry.data_offset != sparse->entries()[i].data_offset) std::abort();
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
