#include "lib/exec/resume.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/io/byte_source.h"
#include "lib/io/digesting_source.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/posix_driver.h"

namespace reshard {

namespace {

// Bytes HashFile reads at a time: large enough that XXH3 runs at memory speed between reads,
// small beside the executor's memory bound (one buffer per worker checking a reused file).
constexpr uint64_t kHashChunkBytes = 4 << 20;

}  // namespace

absl::StatusOr<uint64_t> HashFile(const kvstore::Driver& driver, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<DriverFileSource> source, DriverFileSource::Open(driver, path),
                   "checksumming a file");
  return Xxh3OfSource(*source, kHashChunkBytes);
}

absl::StatusOr<uint64_t> HashFile(const std::string& path) {
  ASSIGN_OR_RETURN(kvstore::Location location, kvstore::ParseLocation(path));
  return HashFile(*location.driver, location.path);
}

std::optional<WrittenFile> ReuseCompletedFile(const FilePlan& file, const Directory& dir,
                                              const ExecutorOptions& options,
                                              double& verify_seconds, bool& mismatch) {
  auto recorded = options.completed_files.find(file.name);
  if (recorded != options.completed_files.end()) {
    const Clock::time_point start = Clock::now();
    auto place = dir.OpenParentOf(file.name);
    auto st = place.ok() ? place->folder.StatChild(place->name) : place.status();
    if (st.ok() && S_ISREG(st->st_mode) && static_cast<uint64_t>(st->st_size) == file.bytes) {
      auto hash = HashFile(kvstore::GetPosixDriver(), dir.PathOf(file.name));
      verify_seconds += SecondsSince(start);
      if (hash.ok() && *hash == recorded->second) {
        return WrittenFile{file.name, file.bytes, *hash, static_cast<int>(file.tensors.size())};
      }
    }
    mismatch = true;
  }
  // Written again; Create fails loudly if it stays.
  if (auto place = dir.OpenParentOf(file.name); place.ok()) {
    place->folder.RemoveFile(place->name).IgnoreError();
  }
  return std::nullopt;
}

}  // namespace reshard
