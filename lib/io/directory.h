// An open folder, and the handle-relative operations that never follow a symlink.
//
// Once a folder is open, everything done inside it goes through its descriptor (`openat`,
// `mkdirat`, `renameat`, `unlinkat`): what its path name points to later does not matter. A
// folder renamed away, or replaced by a symlink to somewhere else while a job runs, cannot
// redirect a write, a rename or a deletion. Names given to these methods are single plain
// components (no '/', not "." or ".."), and none of them follows a symlink: a symlink met
// where a folder or file is expected is refused, and `RemoveTree` deletes links, not what
// they point to.

#ifndef RESHARD_LIB_IO_DIRECTORY_H_
#define RESHARD_LIB_IO_DIRECTORY_H_

#include <sys/stat.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

class Directory {
 public:
  // Opens the folder at `path`, following symlinks in it (the caller has decided that this
  // path is the one meant; from now on the handle is used).
  static absl::StatusOr<Directory> Open(const std::string& path);
  // Takes ownership of `fd`, an open folder known by `path` in messages.
  static Directory Adopt(int fd, std::string path);

  Directory() = default;
  Directory(Directory&& other) noexcept;
  Directory& operator=(Directory&& other) noexcept;
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;
  ~Directory();

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // The path the folder was opened by: for messages only, never reopened.
  const std::string& path() const { return path_; }
  std::string PathOf(absl::string_view name) const;

  // The child folder `name`, created first (mode 0755) when `create` and missing. A symlink
  // there is PermissionDenied.
  absl::StatusOr<Directory> OpenChild(absl::string_view name, bool create = false) const;
  // lstat of the child `name` (never follows it). NotFound when absent.
  absl::StatusOr<struct stat> StatChild(absl::string_view name) const;
  // The child's names, without "." and "..".
  absl::StatusOr<std::vector<std::string>> List() const;
  // The child file `name` opened with `flags` (O_NOFOLLOW and O_CLOEXEC are added).
  absl::StatusOr<int> OpenFile(absl::string_view name, int flags, mode_t mode = 0644) const;
  // unlink of a file or link `name`; absent is fine.
  absl::Status RemoveFile(absl::string_view name) const;
  // Deletes `name` and, when it is a folder, everything below it, walking folder handles: a
  // symlink anywhere below is unlinked, never followed. Absent is fine.
  absl::Status RemoveTree(absl::string_view name) const;
  // renameat within this folder.
  absl::Status Rename(absl::string_view from, absl::string_view to) const;
  // fsync of the folder, so renames inside it are durable.
  absl::Status Sync() const;
  // fstat of the folder itself.
  absl::StatusOr<struct stat> Stat() const;

  // For a relative name ("zero/fp32.pt", see CheckRelativeName): the folder holding it, walked
  // one component at a time through OpenChild (so no symlink is followed) and created along
  // the way when `create`, and the last component. A plain name gives a duplicate of this
  // handle. Output formats whose files live in subfolders (DeepSpeed universal checkpoints'
  // `zero/<param>/fp32.pt`, Megatron's `iter_0000100/mp_rank_00/...`) are written this way.
  struct Place;
  absl::StatusOr<Place> OpenParentOf(absl::string_view relative, bool create = false) const;
  // A duplicate of this handle (its own descriptor).
  absl::StatusOr<Directory> Duplicate() const;

 private:
  int fd_ = -1;
  std::string path_;
};

struct Directory::Place {
  Directory folder;
  std::string name;  // one plain component inside `folder`
};

// InvalidArgument unless `name` is one plain path component.
absl::Status CheckPlainName(absl::string_view name);

// Output files may sit in subfolders of the output folder: at most this many components.
inline constexpr int kMaxRelativeNameDepth = 8;

// InvalidArgument unless `name` is 1 to kMaxRelativeNameDepth plain components joined by '/'
// (no leading or trailing '/', no empty, "." or ".." component).
absl::Status CheckRelativeName(absl::string_view name);

// The kind of file `mode` describes, for messages: "a FIFO", "a socket", "a folder", ...
std::string DescribeFileType(mode_t mode);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_DIRECTORY_H_
