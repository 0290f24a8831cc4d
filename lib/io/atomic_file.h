// An output file written under a temporary name and renamed into place only when complete.
//
// `Create` opens `<dir>/<name>.partial` (exclusively); `Append` writes; `Commit` fsyncs,
// closes, renames to `<dir>/<name>` and fsyncs the folder. Destroying an uncommitted file
// removes the partial one, so no file ever appears under its final name half-written. All of
// it goes through the folder's handle (lib/io/directory.h), never its path name.

#ifndef RESHARD_LIB_IO_ATOMIC_FILE_H_
#define RESHARD_LIB_IO_ATOMIC_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/directory.h"

namespace reshard {

class AtomicFile {
 public:
  // `dir` must stay open until the file is committed or destroyed.
  static absl::StatusOr<AtomicFile> Create(const Directory& dir, const std::string& name);

  AtomicFile() = default;
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends `data` and starts its writeback (sync_file_range) without waiting for it.
  absl::Status Append(absl::string_view data);
  // Makes the file durable and visible under its final name.
  absl::Status Commit();

  uint64_t bytes_written() const { return bytes_written_; }
  const std::string& final_path() const { return final_path_; }

 private:
  void Abandon();

  int fd_ = -1;
  int dir_fd_ = -1;  // a duplicate of the folder's descriptor, owned
  std::string temp_name_;
  std::string final_name_;
  std::string temp_path_;
  std::string final_path_;
  uint64_t bytes_written_ = 0;
};

// Writes `contents` to `<dir>/<name>` through an AtomicFile.
absl::Status WriteFileAtomically(const Directory& dir, const std::string& name,
                                 absl::string_view contents);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_ATOMIC_FILE_H_
