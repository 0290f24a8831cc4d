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

#ifndef RESHARD_LIB_IO_FILE_ACCESS_H_
#define RESHARD_LIB_IO_FILE_ACCESS_H_

#include <cstdint>
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

// Reads a whole small input file (an index, a tracker file) through OpenRegularFile;
// InvalidArgument naming the file when it is larger than `max_bytes`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

// Up to the first `max_bytes` bytes of an input file (format probes), through
// OpenRegularFile.
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes);

// lstat-like check of an input path without opening it: NotFound when absent,
// InvalidArgument when it is neither a regular file nor a folder (after following
// symlinks). Used before format detection so that no reader opens a FIFO.
absl::Status CheckInputFileType(const std::string& path);

// The folder `path` for writing outputs into, created with its missing parents: under a
// confinement through PathConfinement::OpenFolder; otherwise symlinks in the existing part
// are followed once (the user named them) and the missing part is created handle by handle.
absl::StatusOr<Directory> OpenFolderCreating(const std::string& path);

// The existing folder `path`: under a confinement through PathConfinement::OpenFolder (no
// symlink followed), otherwise as given. NotFound when absent.
absl::StatusOr<Directory> OpenExistingFolder(const std::string& path);

// Whether `path` names remote storage ("s3://bucket/key", "gs://..."): scheme "://".
bool IsRemotePath(const std::string& path);
// InvalidArgument for a remote path (not supported yet), naming `what` and the path.
absl::Status CheckLocalPath(const std::string& path, const std::string& what);

// Remote inputs. An input path may name a file or folder of an object store registered for
// its scheme (lib/io/remote_store.h): ReadSmallFile, ReadFilePrefix and CheckInputFileType
// read those through the store, and the functions below dispatch local and remote paths, so
// that a format reads either without knowing which. OpenRegularFile refuses remote paths;
// MappedFile::Open reads them.

// OK for a local path and for a remote one whose scheme has a store in this binary;
// Unimplemented naming `what`, the path and the schemes read otherwise. Nothing is accessed.
absl::Status CheckInputPath(const std::string& path, const std::string& what);

// Whether input `path` is a folder: false when it is a file or absent (NotFound, a dangling
// symlink included). Any other failure to check it (permission, a symlink loop, an I/O error,
// a store's error such as S3's 503) is returned, naming the path: a checkpoint that cannot be
// looked at is not taken for one that is not there. Format probes and readers use these.
absl::StatusOr<bool> CheckInputFolder(const std::string& path);
// Whether input `path` exists (file or folder); errors as CheckInputFolder.
absl::StatusOr<bool> CheckInputExists(const std::string& path);
// Whether input `path` is a file (local: a regular file, symlinks followed); errors as
// CheckInputFolder.
absl::StatusOr<bool> CheckInputFile(const std::string& path);

// The size of input file `path`: NotFound naming it when absent, InvalidArgument when it is a
// folder (remote) or not a regular file (local).
absl::StatusOr<uint64_t> InputFileSize(const std::string& path);

// What a reader records of an input file it locates data in (SourceFile): its size, and a
// remote file's version (RemoteStat::version, S3's ETag; from the folder's listing in a
// ScopedRemoteListingCache); empty for a local file.
struct InputFileInfo {
  uint64_t size = 0;
  std::string version;
};
// As InputFileSize, with the version.
absl::StatusOr<InputFileInfo> StatInputFile(const std::string& path);

// The names of the files directly inside input folder `dir`, hidden ones (".x") included,
// unsorted; regular files only for a local folder (symlinks followed). Errors name `dir`.
absl::StatusOr<std::vector<std::string>> ListInputFolder(const std::string& dir);

// The names of every entry directly inside input folder `dir`, unsorted: for a local folder
// files, folders and special files alike (a reader that then opens what a name promises
// refuses a FIFO by name instead of missing it), for a remote one its files (ListInputFolder:
// an object store has no special files). Errors name `dir`.
absl::StatusOr<std::vector<std::string>> ListInputFolderEntries(const std::string& dir);

// The names of the folders directly inside input folder `dir`, hidden ones included, unsorted
// (local: symlinks followed). Errors name `dir`.
absl::StatusOr<std::vector<std::string>> ListInputSubfolders(const std::string& dir);

// Remembers, for the calling thread while it lives, what remote paths are and what remote
// folders hold. Detecting and reading a checkpoint asks the same questions many times (each
// format's Probe checks the folder, its trackers and marker files), and every answer is a
// request (a missing key costs a HEAD and a LIST). In scope, the functions above remember each
// remote answer, and a folder known to be one is listed once (files and folders in one
// listing) to answer CheckInputFolder, CheckInputFile, CheckInputExists, InputFileSize and
// CheckInputFileType of the paths directly inside it. For a span over which the input does not
// change (LoadInput: detection and the metadata read); other threads and local paths are not
// affected. Scopes nest: an inner one uses the outer one's cache.
class ScopedRemoteListingCache {
 public:
  ScopedRemoteListingCache();
  ~ScopedRemoteListingCache();
  ScopedRemoteListingCache(const ScopedRemoteListingCache&) = delete;
  ScopedRemoteListingCache& operator=(const ScopedRemoteListingCache&) = delete;

  struct Cache;

 private:
  std::unique_ptr<Cache> cache_;  // null when an outer scope's is used
};

// For tests: use the O_NOFOLLOW walk even where openat2 exists.
void DisableOpenat2ForTesting(bool disable);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_FILE_ACCESS_H_
