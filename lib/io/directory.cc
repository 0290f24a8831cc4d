#include "lib/io/directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

// Deeper trees than this are not checkpoints' staging folders; refusing bounds the recursion.
constexpr int kMaxRemoveDepth = 64;

absl::Status RemoveTreeAt(int parent_fd, const std::string& name, const std::string& path,
                          int depth) {
  if (depth > kMaxRemoveDepth) {
    return absl::FailedPreconditionError(
        absl::StrCat("not removing ", path, ": nested more than ", kMaxRemoveDepth, " deep"));
  }
  struct stat st;
  if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISDIR(st.st_mode)) {
    // Files, FIFOs and symlinks alike: the name goes, a link's target is untouched.
    if (::unlinkat(parent_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("removing ", path));
    }
    return absl::OkStatus();
  }
  const int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    // ELOOP/ENOTDIR: swapped for a symlink or file since the fstatat; unlink the name instead.
    if (errno == ELOOP || errno == ENOTDIR) {
      if (::unlinkat(parent_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
        return ErrnoToStatus(errno, absl::StrCat("removing ", path));
      }
      return absl::OkStatus();
    }
    return ErrnoToStatus(errno, absl::StrCat("opening ", path));
  }
  Directory dir = Directory::Adopt(fd, path);
  ASSIGN_OR_RETURN(std::vector<std::string> children, dir.List());
  for (const std::string& child : children) {
    RETURN_IF_ERROR(RemoveTreeAt(dir.fd(), child, dir.PathOf(child), depth + 1));
  }
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("removing folder ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPlainName(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != absl::string_view::npos ||
      name.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", name, "\" is not a plain file or folder name"));
  }
  return absl::OkStatus();
}

absl::Status CheckRelativeName(absl::string_view name) {
  const std::vector<absl::string_view> components = absl::StrSplit(name, '/');
  if (components.size() > kMaxRelativeNameDepth) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is nested more than ",
                                                   kMaxRelativeNameDepth, " folders deep"));
  }
  for (absl::string_view component : components) {
    if (!CheckPlainName(component).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", name, "\" is not a relative name of plain components"));
    }
  }
  return absl::OkStatus();
}

std::string DescribeFileType(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISLNK(mode)) return "a symlink";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

absl::StatusOr<Directory> Directory::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening folder ", path));
  return Adopt(fd, path);
}

Directory Directory::Adopt(int fd, std::string path) {
  Directory dir;
  dir.fd_ = fd;
  dir.path_ = std::move(path);
  return dir;
}

Directory::Directory(Directory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

Directory& Directory::operator=(Directory&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

Directory::~Directory() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Directory::PathOf(absl::string_view name) const {
  if (path_.empty() || path_ == "/") return absl::StrCat(path_, name);
  return absl::StrCat(path_, "/", name);
}

absl::StatusOr<Directory> Directory::OpenChild(absl::string_view name, bool create) const {
  RETURN_IF_ERROR(CheckPlainName(name));
  const std::string child(name);
  if (create && ::mkdirat(fd_, child.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating folder ", PathOf(name)));
  }
  const int fd = ::openat(fd_, child.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ELOOP || error == ENOTDIR) {
      struct stat st;
      const bool is_link =
          ::fstatat(fd_, child.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
      if (is_link || error == ELOOP) {
        return absl::PermissionDeniedError(absl::StrCat(
            PathOf(name), " is a symlink where a folder is expected; reshard does not follow it"));
      }
      return absl::FailedPreconditionError(absl::StrCat(PathOf(name), " is not a folder (it is ",
                                                        DescribeFileType(st.st_mode), ")"));
    }
    return ErrnoToStatus(error, absl::StrCat("opening folder ", PathOf(name)));
  }
  return Adopt(fd, PathOf(name));
}

absl::StatusOr<struct stat> Directory::StatChild(absl::string_view name) const {
  RETURN_IF_ERROR(CheckPlainName(name));
  struct stat st;
  if (::fstatat(fd_, std::string(name).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", PathOf(name)));
  }
  return st;
}

absl::StatusOr<std::vector<std::string>> Directory::List() const {
  // fdopendir takes over the descriptor it is given: hand it a duplicate.
  const int fd = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening folder ", path_));
  DIR* stream = ::fdopendir(fd);
  if (stream == nullptr) {
    const int error = errno;
    ::close(fd);
    return ErrnoToStatus(error, absl::StrCat("listing ", path_));
  }
  std::vector<std::string> names;
  errno = 0;
  while (const struct dirent* entry = ::readdir(stream)) {
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
    errno = 0;
  }
  const int error = errno;
  ::closedir(stream);
  if (error != 0) return ErrnoToStatus(error, absl::StrCat("listing ", path_));
  return names;
}

absl::StatusOr<int> Directory::OpenFile(absl::string_view name, int flags, mode_t mode) const {
  RETURN_IF_ERROR(CheckPlainName(name));
  const int fd = ::openat(fd_, std::string(name).c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::PermissionDeniedError(
          absl::StrCat(PathOf(name), " is a symlink; reshard does not follow it"));
    }
    return ErrnoToStatus(errno, absl::StrCat("opening ", PathOf(name)));
  }
  return fd;
}

absl::Status Directory::RemoveFile(absl::string_view name) const {
  RETURN_IF_ERROR(CheckPlainName(name));
  if (::unlinkat(fd_, std::string(name).c_str(), 0) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("removing ", PathOf(name)));
  }
  return absl::OkStatus();
}

absl::Status Directory::RemoveTree(absl::string_view name) const {
  RETURN_IF_ERROR(CheckPlainName(name));
  return RemoveTreeAt(fd_, std::string(name), PathOf(name), 0);
}

absl::Status Directory::Rename(absl::string_view from, absl::string_view to) const {
  RETURN_IF_ERROR(CheckPlainName(from));
  RETURN_IF_ERROR(CheckPlainName(to));
  if (::renameat(fd_, std::string(from).c_str(), fd_, std::string(to).c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("renaming ", PathOf(from), " to ", PathOf(to)));
  }
  return absl::OkStatus();
}

absl::Status Directory::Sync() const {
  if (::fsync(fd_) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync folder ", path_));
  return absl::OkStatus();
}

absl::StatusOr<Directory> Directory::Duplicate() const {
  const int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("duplicating the handle of ", path_));
  return Adopt(fd, path_);
}

absl::StatusOr<Directory::Place> Directory::OpenParentOf(absl::string_view relative,
                                                         bool create) const {
  RETURN_IF_ERROR(CheckRelativeName(relative));
  std::vector<absl::string_view> components = absl::StrSplit(relative, '/');
  Place place;
  place.name = std::string(components.back());
  components.pop_back();
  ASSIGN_OR_RETURN(place.folder, Duplicate());
  for (absl::string_view component : components) {
    ASSIGN_OR_RETURN(place.folder, place.folder.OpenChild(component, create));
  }
  return place;
}

absl::StatusOr<struct stat> Directory::Stat() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path_));
  return st;
}

}  // namespace reshard
