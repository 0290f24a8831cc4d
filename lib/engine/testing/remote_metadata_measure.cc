#include "lib/engine/testing/remote_metadata_measure.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "lib/plan/partition_rules.h"

namespace reshard {

void UploadFiles(kvstore::MemoryDriver& store, const std::string& url,
                 const std::map<std::string, std::string>& files) {
  for (const auto& [name, bytes] : files) store.Put(absl::StrCat(url, "/", name), bytes);
}

MetadataLoad MeasureLoadInput(kvstore::MemoryDriver& store, const std::string& url) {
  MetadataLoad load;
  const int reads = store.reads();
  const int lookups = store.lookups();
  store.reset_max_concurrent_reads();
  const absl::Time start = absl::Now();
  load.loaded = LoadInput(url, PartitionRules(), /*require_model=*/true);
  load.time = absl::Now() - start;
  load.reads = store.reads() - reads;
  load.lookups = store.lookups() - lookups;
  load.max_concurrent_reads = store.max_concurrent_reads();
  return load;
}

MetadataLoad UploadAndMeasure(const std::string& url,
                              const std::map<std::string, std::string>& files, absl::Duration delay,
                              const std::string& what) {
  UploadFiles(kvstore::GetMemoryDriver(), url, files);
  kvstore::GetMemoryDriver().set_read_delay(delay);
  MetadataLoad load = MeasureLoadInput(kvstore::GetMemoryDriver(), url);
  std::printf(
      "remote metadata: %s: %.0f ms, %d range reads, %d lookups, %d reads at once at "
      "most\n",
      what.c_str(), absl::ToDoubleMilliseconds(load.time), load.reads, load.lookups,
      load.max_concurrent_reads);
  return load;
}

std::vector<std::pair<int64_t, std::string>> PieceRowsAndFiles(const Catalog& catalog,
                                                               const std::string& name) {
  std::vector<std::pair<int64_t, std::string>> pieces;
  const int index = catalog.Find(name);
  if (index < 0) return pieces;
  for (const SourcePiece& piece : catalog.tensors[index].pieces) {
    pieces.emplace_back(piece.box.origin.empty() ? 0 : piece.box.origin[0],
                        catalog.files[piece.file].path);
  }
  return pieces;
}

}  // namespace reshard
