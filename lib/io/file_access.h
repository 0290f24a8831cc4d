// Input files and folders, on any storage (lib/io/kvstore): each function parses its path into
// a kvstore::Location and asks that driver, so that a format reads local files, S3 objects and
// in-memory ones alike without knowing which. Opens of local files go through
// lib/io/path_confinement.h (included here), which keeps reshardd's jobs inside their roots.

#ifndef RESHARD_LIB_IO_FILE_ACCESS_H_
#define RESHARD_LIB_IO_FILE_ACCESS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/io/path_confinement.h"

namespace reshard {

// Reads a whole small input file (an index, a tracker file) through its driver;
// InvalidArgument naming the file when it is larger than `max_bytes`, a folder, or neither a
// file nor a folder.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

// Up to the first `max_bytes` bytes of an input file (format probes); errors as
// ReadSmallFile.
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes);

// Stat of an input path without opening it for reading: NotFound when absent,
// InvalidArgument when it is neither a regular file nor a folder (after following
// symlinks). Used before format detection so that no reader opens a FIFO. Under a
// PathConfinement a local path outside the roots is PermissionDenied.
absl::Status CheckInputFileType(const std::string& path);

// OK when a driver in this binary serves `path` (kvstore::ParseLocation); Unimplemented
// naming `what`, the path and the schemes served otherwise. Nothing is accessed.
absl::Status CheckInputPath(const std::string& path, const std::string& what);

// What the driver of input `path` can do (lib/io/kvstore/driver.h), for readers that read
// differently by storage; false for a path no driver in this binary serves.
// Whether every read and lookup of `path` is a request (a driver that does not map files,
// s3:// and mem://): callers keep several in flight and read metadata ahead.
bool InputReadsAreRequests(const std::string& path);
// Whether folders exist of their own (posix): can be empty, hold symlinks and special files.
// Otherwise a folder is a key prefix (kvstore::Driver::has_folders).
bool InputHasFolders(const std::string& path);

// Whether input `path` is a folder: false when it is a file or absent (NotFound, a dangling
// symlink included). Any other failure to check it (permission, a symlink loop, an I/O error,
// a store's error such as S3's 503) is returned, naming the path: a checkpoint that cannot be
// looked at is not taken for one that is not there. Format probes and readers use these.
absl::StatusOr<bool> CheckInputFolder(const std::string& path);
// Whether input `path` exists (file or folder); errors as CheckInputFolder.
absl::StatusOr<bool> CheckInputExists(const std::string& path);
// Whether input `path` is a file (posix: a regular file, symlinks followed); errors as
// CheckInputFolder.
absl::StatusOr<bool> CheckInputFile(const std::string& path);

// The size of input file `path`: NotFound naming it when absent, InvalidArgument when it is a
// folder or neither a file nor a folder.
absl::StatusOr<uint64_t> InputFileSize(const std::string& path);

// What a reader records of an input file it locates data in (SourceFile): its size, and its
// version where the driver has them (kvstore::PathStat::version, S3's ETag; from the folder's
// listing in a ScopedRemoteListingCache); empty for a posix file.
struct InputFileInfo {
  uint64_t size = 0;
  std::string version;
};
// As InputFileSize, with the version.
absl::StatusOr<InputFileInfo> StatInputFile(const std::string& path);

// What input folder `dir` holds directly, from one listing (kvstore::Driver::List), each list
// sorted by name, hidden names (".x") included: files (posix: regular files, symlinks
// followed), folders, and (posix) entries that are neither. Errors name `dir`.
struct InputListing {
  std::vector<std::string> files;
  std::vector<std::string> folders;
  std::vector<std::string> others;
};
absl::StatusOr<InputListing> ListInput(const std::string& dir);

// The names of the files directly inside input folder `dir`, hidden ones (".x") included,
// unsorted (posix: regular files, symlinks followed). Errors name `dir`.
absl::StatusOr<std::vector<std::string>> ListInputFolder(const std::string& dir);

// The names of every entry directly inside input folder `dir`, unsorted: files, folders and
// (posix) special files alike, so that a reader that then opens what a name promises refuses a
// FIFO by name instead of missing it. Errors name `dir`.
absl::StatusOr<std::vector<std::string>> ListInputFolderEntries(const std::string& dir);

// The names of the folders directly inside input folder `dir`, hidden ones included, unsorted
// (local: symlinks followed). Errors name `dir`.
absl::StatusOr<std::vector<std::string>> ListInputSubfolders(const std::string& dir);

// Remembers, for the calling thread while it lives, what paths of drivers whose answers are
// requests (those that do not map files: s3, memory) are and what their folders hold.
// Detecting and reading a checkpoint asks the same questions many times (each format's Probe
// checks the folder, its trackers and marker files), and every answer is a request (a missing
// key costs a HEAD and a LIST). In scope, the functions above remember each such answer, and a folder known to be one is listed once (files and folders in one
// listing) to answer CheckInputFolder, CheckInputFile, CheckInputExists, InputFileSize and
// CheckInputFileType of the paths directly inside it. For a span over which the input does not
// change (LoadInput: detection and the metadata read); other threads and posix paths are not
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

}  // namespace reshard

#endif  // RESHARD_LIB_IO_FILE_ACCESS_H_
