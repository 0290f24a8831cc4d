#include "lib/exec/resume.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <xxhash.h>
#if defined(__x86_64__)
// XXH3 of libxxhash with runtime dispatch to AVX2 / AVX-512: its plain entry points use SSE2.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"

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
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  constexpr uint64_t kChunk = 16 << 20;
  for (uint64_t offset = 0; offset < file.size(); offset += kChunk) {
    const uint64_t length = std::min(kChunk, file.size() - offset);
    XXH3_64bits_update(state, file.data() + offset, length);
    file.Release(offset, length);
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
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
