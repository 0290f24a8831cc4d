// The storage layer's driver interface (tensorstore's kvstore is the model).
//
// Every place reshard reads checkpoints from or writes them to is a Driver: `posix` (local and
// mounted paths, lib/io/kvstore/posix_driver.h), `s3` (lib/io/s3/s3_store.h) and `memory`
// (lib/io/kvstore/memory_driver.h). A user's path string is parsed once into a Location
// (lib/io/kvstore/location.h) that carries its driver, and the code above asks that driver;
// what differs between kinds of storage is what the driver says it can do (`maps_files`), not
// the path's spelling.
//
// A driver has files (with a size and, where the storage has them, versions) and folders: a
// path names a file, a folder, or (posix only) something else (a FIFO, socket or device).
// Paths are given to a driver as the user spelled them ("s3://b/p/x", "mem://b/x", "ckpt/x"),
// so that every error names the path the user gave.

#ifndef RESHARD_LIB_IO_KVSTORE_DRIVER_H_
#define RESHARD_LIB_IO_KVSTORE_DRIVER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace reshard {
namespace kvstore {

// What a path names.
struct PathStat {
  bool is_folder = false;
  uint64_t size = 0;  // of a file; 0 for a folder
  // Which version of the file this is (S3: its ETag), when the driver has versions; empty
  // otherwise (posix). Reads compare it (ReadRange's `opened`).
  std::string version;
  // What tells this file's contents from a replacement's without reading it, on every driver:
  // S3 the ETag, memory the version, posix "<inode>:<mtime ns>:<size>" (a file renamed over
  // it has another inode; a write in place moves the mtime, except one that keeps the size
  // within the filesystem's timestamp granularity). Empty for a folder. Output commits record
  // it to decide whether a finished file can be reused (lib/engine/output_commit.h).
  std::string generation;
  // What a path that is neither a regular file nor a folder is (posix, symlinks followed: "a
  // FIFO (named pipe)", "a socket", ...); empty for files and folders.
  std::string special;
};

// A file directly inside a folder.
struct FileEntry {
  std::string name;  // without the folder: "model-00001-of-00002.safetensors"
  uint64_t size = 0;
  std::string version;  // as PathStat::version (S3: the ETag LIST gives, as HEAD's)
};

// What a folder holds directly.
struct Listing {
  std::vector<FileEntry> files;
  std::vector<std::string> folders;  // names without '/': "global_step10"
  // Entries that are neither (posix: FIFOs, sockets, devices), by name.
  std::vector<std::string> others;
};

// How a file is written.
struct WriteOptions {
  // The file's size when known in advance (S3: the upload's part size); 0 when not.
  uint64_t size_hint = 0;
  // The most memory the writer may hold besides what the caller gives it (WriteMemoryBound);
  // 0: the driver's own choice. A driver that cannot go lower holds its minimum (S3: two parts).
  uint64_t memory_budget = 0;
  // Kept with the file where the storage has user metadata (S3: x-amz-meta-<name>); ignored
  // elsewhere.
  std::map<std::string, std::string> metadata;
};

// A file being written: it appears under its path, whole, only when Commit returns OK; a
// writer destroyed or aborted before leaves nothing under the path. Not thread safe.
class Writer {
 public:
  virtual ~Writer() = default;
  // Appends `data`. Errors name the path.
  virtual absl::Status Append(absl::string_view data) = 0;
  // Publishes the file under its path, replacing what was there. Returns the file's
  // generation (PathStat::generation) where the storage gives it with the write (S3: the
  // ETag; memory: the version); empty otherwise (posix: Stat gives it).
  virtual absl::StatusOr<std::string> Commit() = 0;
  // Drops what was written; the path is left as it was. Idempotent.
  virtual void Abort() = 0;
  // Bytes appended so far.
  virtual uint64_t pos() const = 0;
};

// One kind of storage. Implementations are thread safe: the executor reads from several
// threads at once. Errors name the path (and the range for reads) and the storage's error.
class Driver {
 public:
  virtual ~Driver() = default;

  // The URL scheme this driver serves ("s3", "mem"); "" for posix paths.
  virtual absl::string_view scheme() const = 0;

  // Whether files can be memory-mapped (posix): their bytes are then read from a mapping or
  // with pread, without a request; otherwise every read is ReadRange.
  virtual bool maps_files() const { return false; }

  // Whether folders exist of their own (posix: they can be empty, and hold symlinks and
  // special files). Otherwise (S3, memory) a folder is a key prefix: it exists while a file
  // under it does, and a path's "." or empty segments would name another key.
  virtual bool has_folders() const { return false; }

  // Whether `path` names the same file or folder from any working folder (posix: it starts
  // with '/'). URLs always do.
  virtual bool IsAbsolute(absl::string_view path) const { return true; }

  // `path` spelled so that it names the same file or folder from any working folder (posix:
  // made absolute against the current folder, "." and ".." and repeated '/' removed lexically,
  // no trailing '/'). URLs are returned as given. Nothing is accessed.
  virtual std::string AbsolutePath(const std::string& path) const { return path; }

  // The one spelling of `path` that paths are confined by (reshardd's allowed roots): a path
  // lies in a root when it equals the root's or continues it after a '/'. Posix: resolved with
  // realpath(3), symlinks followed; with `must_exist` false a path that does not exist yet is
  // resolved through its deepest existing ancestor, the names below it plain (PermissionDenied
  // for "." or ".." there, or for a dangling symlink); NotFound naming `path` when it must
  // exist and does not. Stores without folders of their own (S3, memory): the key is validated
  // (InvalidArgument naming `path` for "." or ".." or empty segments; S3: the bucket name and
  // key rules of ParseS3Url) and a trailing '/' dropped; nothing is accessed.
  virtual absl::StatusOr<std::string> ConfinedPath(const std::string& path, bool must_exist) const;

  // The file or folder `path` names. NotFound naming `path` when neither exists.
  virtual absl::StatusOr<PathStat> Stat(const std::string& path) const = 0;

  // The files and folders directly inside folder `path` in one listing (S3: one LIST with
  // delimiter '/' and its continuation pages), each sorted by name; empty when there are none.
  virtual absl::StatusOr<Listing> List(const std::string& path) const = 0;

  // Reads exactly out.size() bytes at `offset` of file `path` into `out`. `opened` is the
  // file's Stat when the caller opened it: the read fails with FailedPrecondition naming
  // `path`, the offset and both versions when the file is another version now, and DataLoss
  // when the storage answers for another range or size (the bytes would be misplaced) or the
  // file ends before. Several reads may be in flight at once, from several threads.
  virtual absl::Status ReadRange(const std::string& path, uint64_t offset, absl::Span<char> out,
                                 const PathStat& opened) const = 0;

  // Creates file `path` holding `bytes` only when nothing is there: AlreadyExists naming the
  // path when a file already is (posix: O_EXCL and link(2); S3: PUT with If-None-Match: *).
  // Of several concurrent calls for one path, exactly one succeeds.
  virtual absl::Status CreateExclusive(const std::string& path, absl::string_view bytes) const = 0;

  // A streamed writer of file `path` (posix: a temporary file renamed into its folder; S3: a
  // multipart upload). Missing parent folders are created where the storage has folders.
  virtual absl::StatusOr<std::unique_ptr<Writer>> Write(const std::string& path,
                                                        const WriteOptions& options) const = 0;

  // Writes file `path` holding `bytes` (a small file: a record, an index, a manifest), replacing
  // what was there; returns as Writer::Commit. S3: one PUT. By default through Write.
  virtual absl::StatusOr<std::string> WriteFile(const std::string& path,
                                                absl::string_view bytes) const;

  // Writes file `path` as WriteFile does, without waiting for the storage to make it durable:
  // a crash of the process leaves it whole or absent, but after a crash of the machine it may
  // be missing, empty or cut short (posix: written and renamed into place with no fsync). For
  // small files whose reader checks them and whose loss costs only work to redo (the output
  // commit's records, lib/engine/output_commit.h). By default WriteFile: storage whose writes
  // are durable once answered (S3, memory) has nothing to leave out.
  virtual absl::StatusOr<std::string> WriteFileUnsynced(const std::string& path,
                                                        absl::string_view bytes) const {
    return WriteFile(path, bytes);
  }

  // The most memory a Writer made with `options` holds besides what the caller gives it (S3:
  // the upload's parts in flight; memory: the whole file until Commit). Default: none.
  virtual uint64_t WriteMemoryBound(const WriteOptions& options) const { return 0; }

  // Drops the writes under way of files whose path starts with `prefix` that a killed process
  // left (S3: unfinished multipart uploads, which are billed and invisible). OK when the
  // storage has none of its own (posix: a killed writer's temporary file is named so that
  // nothing reads it; memory: nothing survives the process).
  virtual absl::Status AbortUnfinishedWrites(const std::string& prefix) const {
    return absl::OkStatus();
  }

  // Deletes file `path`; OK when there is none (S3's DELETE does not tell).
  virtual absl::Status Delete(const std::string& path) const = 0;
};

}  // namespace kvstore
}  // namespace reshard

#endif  // RESHARD_LIB_IO_KVSTORE_DRIVER_H_
