// The posix driver: local and mounted paths.
//
// Reads go through lib/io/path_confinement.h: under a PathConfinement (a reshardd job) every
// file is opened beneath its allowed root with no symlink followed, and outside one paths are
// opened as given; FIFOs, sockets and devices are never opened for reading. Files can be
// memory-mapped (maps_files), which MappedFile does for data reads. Writes go through the
// parent folder's handle: a temporary file renamed into place (Write), or linked under its name
// only when nothing is there (CreateExclusive). Files have no versions; their generation is
// "<inode>:<mtime ns>:<size>" (PathStat::generation).

#ifndef RESHARD_LIB_IO_KVSTORE_POSIX_DRIVER_H_
#define RESHARD_LIB_IO_KVSTORE_POSIX_DRIVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/io/kvstore/driver.h"

namespace reshard {
namespace kvstore {

class PosixDriver final : public Driver {
 public:
  absl::string_view scheme() const override { return ""; }
  bool maps_files() const override { return true; }
  bool has_folders() const override { return true; }

  bool IsAbsolute(absl::string_view path) const override;
  std::string AbsolutePath(const std::string& path) const override;
  // realpath(3) of `path`, or of its deepest existing ancestor followed by the plain names
  // below it (`must_exist` false); no trailing '/'.
  absl::StatusOr<std::string> ConfinedPath(const std::string& path,
                                           bool must_exist) const override;

  // stat(2) of `path` (symlinks followed); under a confinement the path is also opened
  // (O_PATH) beneath its root, so a path outside the roots is PermissionDenied. NotFound when
  // a component is missing or not a folder.
  absl::StatusOr<PathStat> Stat(const std::string& path) const override;
  // Symlinks followed; a dangling symlink is skipped, an entry that cannot be looked at (a
  // symlink loop, no permission) is an error naming it.
  absl::StatusOr<Listing> List(const std::string& path) const override;
  // pread of the file opened with OpenRegularFile; DataLoss naming the file and offset when it
  // ends before the range does.
  absl::Status ReadRange(const std::string& path, uint64_t offset, absl::Span<char> out,
                         const PathStat& opened) const override;
  absl::Status CreateExclusive(const std::string& path, absl::string_view bytes) const override;
  absl::StatusOr<std::unique_ptr<Writer>> Write(const std::string& path,
                                                const WriteOptions& options) const override;
  // An AtomicFile committed with CommitMode::kVisible: no fsync of the file or its folder.
  absl::StatusOr<std::string> WriteFileUnsynced(const std::string& path,
                                                absl::string_view bytes) const override;
  absl::Status Delete(const std::string& path) const override;
};

// The process's posix driver.
const PosixDriver& GetPosixDriver();

}  // namespace kvstore
}  // namespace reshard

#endif  // RESHARD_LIB_IO_KVSTORE_POSIX_DRIVER_H_
