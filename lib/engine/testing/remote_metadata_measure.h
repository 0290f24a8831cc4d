// What reading a checkpoint's metadata from remote storage costs: LoadInput (detection and the
// metadata read) of files uploaded to the memory driver, timed, with its requests counted.
// Shared by the tests of saves with many ranks and the binary that measures them.
//
// testonly.

#ifndef RESHARD_LIB_ENGINE_TESTING_REMOTE_METADATA_MEASURE_H_
#define RESHARD_LIB_ENGINE_TESTING_REMOTE_METADATA_MEASURE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lib/core/catalog.h"
#include "lib/engine/conversion.h"
#include "lib/io/kvstore/memory_driver.h"

namespace reshard {

// Puts every file of `files` (relative path -> bytes) at `url`/<relative path>.
void UploadFiles(kvstore::MemoryDriver& store, const std::string& url,
                 const std::map<std::string, std::string>& files);

struct MetadataLoad {
  absl::StatusOr<LoadedInput> loaded;
  absl::Duration time;
  int reads = 0;    // range reads LoadInput made
  int lookups = 0;  // Stat and List calls
  int max_concurrent_reads = 0;
};

// LoadInput(`url`) with nothing else using `store` meanwhile.
MetadataLoad MeasureLoadInput(kvstore::MemoryDriver& store, const std::string& url);

// `files` uploaded at `url` of kvstore::GetMemoryDriver(), every read from then on waiting
// `delay`, and LoadInput(`url`) measured; prints "remote metadata: <what>: <time>, <requests>".
MetadataLoad UploadAndMeasure(const std::string& url,
                              const std::map<std::string, std::string>& files, absl::Duration delay,
                              const std::string& what);

// Where tensor `name`'s pieces are, in piece order: each piece's first origin coordinate (the
// row it starts at) and its file's path. Empty when the catalog has no such tensor.
std::vector<std::pair<int64_t, std::string>> PieceRowsAndFiles(const Catalog& catalog,
                                                               const std::string& name);

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_TESTING_REMOTE_METADATA_MEASURE_H_
