// Where a thread may open files, and how inputs and output folders are opened.
//
// reshardd confines every job to its --allowed-root folders. Checking a path with realpath(3)
// at submit is not enough: a folder can be swapped for a symlink between the check and the
// use. So a job runs under a `PathConfinement` (installed for its thread with
// `ScopedPathConfinement`), and every open made for it goes through the functions below:
//
//   * inputs (`OpenRegularFile`): the path is resolved once, must lie inside a root, and is
//     then opened beneath that root's descriptor with no symlink followed
//     (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has it, else a walk of
//     O_NOFOLLOW opens, one component at a time). Whatever changed in between makes the open
//     fail (PermissionDenied), never reach outside.
//   * output folders (`OpenFolderCreating`): opened, and created where missing, by the same
//     walk; everything inside then goes through the Directory handle (lib/io/directory.h).
//
// Without a confinement (the local CLI) the same functions open paths as given, still
// refusing FIFOs, sockets and devices.

#ifndef RESHARD_LIB_IO_PATH_CONFINEMENT_H_
#define RESHARD_LIB_IO_PATH_CONFINEMENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/io/directory.h"

namespace reshard {

class PathConfinement {
 public:
  // Resolves and opens every root. NotFound/InvalidArgument when one is missing or not a
  // folder. With no roots, every open is PermissionDenied.
  static absl::StatusOr<std::shared_ptr<const PathConfinement>> Create(
      const std::vector<std::string>& roots);

  // The resolved roots, without trailing slash.
  const std::vector<std::string>& roots() const { return roots_; }

  // Opens the existing file or folder `path` with `flags` (O_CLOEXEC added): resolved once,
  // then opened beneath the root that holds it without following any symlink.
  // PermissionDenied when it lies outside every root or changed while being opened.
  absl::StatusOr<int> Open(const std::string& path, int flags) const;

  // Opens folder `path` (absolute, no "." or ".." components, symlink-free: a path the
  // PathPolicy resolved), creating missing folders below its root when `create`; every
  // component is opened without following symlinks. `path` may not be a root itself.
  absl::StatusOr<Directory> OpenFolder(const std::string& path, bool create) const;

  ~PathConfinement();

 private:
  struct Root {
    std::string path;
    int fd = -1;
  };
  PathConfinement() = default;
  // The root holding resolved path `path` (longest match), or nullptr; `relative` gets the
  // rest ("" for the root itself).
  const Root* Find(const std::string& path, std::string* relative) const;

  std::vector<Root> root_handles_;
  std::vector<std::string> roots_;
};

// Installs `confinement` (may be null: none) for the calling thread until destroyed; nests.
class ScopedPathConfinement {
 public:
  explicit ScopedPathConfinement(const PathConfinement* confinement);
  ~ScopedPathConfinement();
  ScopedPathConfinement(const ScopedPathConfinement&) = delete;
  ScopedPathConfinement& operator=(const ScopedPathConfinement&) = delete;

 private:
  const PathConfinement* previous_;
};

// The calling thread's confinement, or nullptr.
const PathConfinement* CurrentPathConfinement();

// Opens an input file for reading: with O_NONBLOCK, so that a FIFO cannot block the open,
// then fstat; anything but a regular file is InvalidArgument naming what it is; the
// descriptor is returned in blocking mode. Under a confinement the file is opened beneath
// its roots (see above).
absl::StatusOr<int> OpenRegularFile(const std::string& path);

// The folder `path` for writing outputs into, created with its missing parents: under a
// confinement through PathConfinement::OpenFolder; otherwise symlinks in the existing part
// are followed once (the user named them) and the missing part is created handle by handle.
absl::StatusOr<Directory> OpenFolderCreating(const std::string& path);

// The existing folder `path`: under a confinement through PathConfinement::OpenFolder (no
// symlink followed), otherwise as given. NotFound when absent.
absl::StatusOr<Directory> OpenExistingFolder(const std::string& path);

// For tests: use the O_NOFOLLOW walk even where openat2 exists.
void DisableOpenat2ForTesting(bool disable);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_PATH_CONFINEMENT_H_
