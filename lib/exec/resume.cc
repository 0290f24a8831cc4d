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

namespace reshard {

absl::StatusOr<uint64_t> HashFile(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  if (!file.mapped()) {
    return absl::UnimplementedError(absl::StrCat("checksumming remote file ", path));
  }
  return HashMappedFile(file);
}

absl::StatusOr<uint64_t> HashFile(const Directory& dir, const std::string& name) {
  ASSIGN_OR_RETURN(Directory::Place place, dir.OpenParentOf(name));
  ASSIGN_OR_RETURN(int fd, place.folder.OpenFile(place.name, O_RDONLY | O_NONBLOCK));
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Adopt(fd, dir.PathOf(name)));
  return HashMappedFile(file);
}

absl::StatusOr<uint64_t> HashMappedFile(const MappedFile& file) {
  ViewByteSource view(
      absl::string_view(reinterpret_cast<const char*>(file.data()), file.size()), file.path());
  return Xxh3OfSource(view, 16 << 20,
                      [&file](uint64_t offset, uint64_t length) { file.Release(offset, length); });
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
      auto hash = HashFile(dir, file.name);
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
