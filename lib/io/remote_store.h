// Object stores that inputs can be read from, by URL scheme ("s3://bucket/key").
//
// lib/io knows remote inputs only through this interface, so that it stays free of HTTP
// clients: a store (lib/io/s3:s3_store for "s3") registers itself for its scheme at static
// initialization, and file_access (listing, probing, small reads) and MappedFile (data reads)
// dispatch every remote path to it. A binary that links no store refuses remote paths.
//
// A store has files (objects, with a size) and folders: a folder "scheme://b/p" exists when
// some file's name starts with "scheme://b/p/", and its files are the ones directly inside
// (no further '/').

#ifndef RESHARD_LIB_IO_REMOTE_STORE_H_
#define RESHARD_LIB_IO_REMOTE_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace reshard {

// What a remote path names.
struct RemoteStat {
  bool is_folder = false;
  uint64_t size = 0;  // of a file; 0 for a folder
  // Which version of the file this is (S3: its ETag), when the store says; empty otherwise.
  std::string version;
};

// A file directly inside a remote folder.
struct RemoteEntry {
  std::string name;  // without the folder: "model-00001-of-00002.safetensors"
  uint64_t size = 0;
  std::string version;  // as RemoteStat::version (S3: the ETag LIST gives, as HEAD's)
};

// What a remote folder holds directly.
struct RemoteListing {
  std::vector<RemoteEntry> files;
  std::vector<std::string> folders;  // names without '/': "global_step10"
};

// One kind of object store. Implementations are thread safe: the executor reads from several
// threads at once. Errors name the URL (and the range for reads) and the store's error code.
class RemoteStore {
 public:
  virtual ~RemoteStore() = default;

  // The file or folder `url` names. NotFound naming `url` when neither exists.
  virtual absl::StatusOr<RemoteStat> Stat(const std::string& url) = 0;

  // The files directly inside folder `url`, sorted by name; empty when there are none.
  virtual absl::StatusOr<std::vector<RemoteEntry>> List(const std::string& url) = 0;

  // The files and the folders directly inside folder `url` in one listing (S3: one LIST with
  // delimiter '/' and its continuation pages), each sorted by name; empty when there are none.
  virtual absl::StatusOr<RemoteListing> ListEntries(const std::string& url) = 0;

  // Reads exactly out.size() bytes at `offset` of file `url` into `out`. `opened` is the file's
  // Stat when the caller opened it: the read fails with FailedPrecondition naming `url`, the
  // offset and both versions when the file is another version now, and DataLoss when the
  // store answers for another range or size (the bytes would be misplaced).
  virtual absl::Status ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                                 const RemoteStat& opened) = 0;
};

// Registers `store` (never destroyed) for URLs "`scheme`://...". A later registration for the
// same scheme replaces the earlier one (tests). Thread safe.
void RegisterRemoteStore(absl::string_view scheme, RemoteStore* store);

// The store for remote path `url` (IsRemotePath). Unimplemented naming the URL and the schemes
// this binary reads when none is registered for its scheme.
absl::StatusOr<RemoteStore*> RemoteStoreFor(absl::string_view url);

// Registers `T` (default-constructed) for `scheme` from a file-scope object:
//   const RemoteStoreRegistration<S3Store> register_s3("s3");
template <typename T>
struct RemoteStoreRegistration {
  explicit RemoteStoreRegistration(absl::string_view scheme) {
    RegisterRemoteStore(scheme, new T());
  }
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_REMOTE_STORE_H_
