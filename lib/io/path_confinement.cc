#include "lib/io/path_confinement.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"
#include "lib/io/kvstore/scheme.h"

namespace reshard {
namespace {

thread_local const PathConfinement* current_confinement = nullptr;

// Set once openat2 answered ENOSYS (an older kernel), or by tests.
std::atomic<bool> openat2_unavailable{false};

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return ErrnoToStatus(errno, absl::StrCat("resolving ", path));
  }
  return std::string(resolved);
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Opens `relative` (components separated by '/', none "." or "..", "" for the folder itself)
// beneath folder `root_fd` without following any symlink. Returns -1 with errno set; ELOOP
// or EXDEV when a symlink or an escape was met.
int OpenBeneath(int root_fd, const std::string& relative, int flags) {
  flags |= O_CLOEXEC;
  if (relative.empty()) return ::openat(root_fd, ".", flags);
  if (!openat2_unavailable.load(std::memory_order_relaxed)) {
    struct open_how how = {};
    how.flags = static_cast<uint64_t>(flags);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    const long fd = ::syscall(SYS_openat2, root_fd, relative.c_str(), &how, sizeof(how));
    if (fd >= 0 || errno != ENOSYS) return static_cast<int>(fd);
    openat2_unavailable.store(true);
  }
  // The walk: every folder on the way opened with O_NOFOLLOW, one component at a time.
  std::vector<std::string> parts = absl::StrSplit(relative, '/', absl::SkipEmpty());
  int dir = ::openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return -1;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i] == "." || parts[i] == "..") {
      ::close(dir);
      errno = EXDEV;
      return -1;
    }
    const bool last = i + 1 == parts.size();
    const int next =
        ::openat(dir, parts[i].c_str(),
                 last ? flags | O_NOFOLLOW : O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int error = errno;
    ::close(dir);
    if (next < 0) {
      // A symlink where a folder was expected gives ENOTDIR with O_DIRECTORY|O_NOFOLLOW.
      errno = (!last && error == ENOTDIR) ? ELOOP : error;
      return -1;
    }
    dir = next;
  }
  return dir;
}

absl::Status ChangedUnderneath(const std::string& path, const std::string& resolved) {
  return absl::PermissionDeniedError(absl::StrCat(
      path, " (", resolved,
      ") changed while being opened: a symlink now stands on the way; reshard follows none "
      "inside the allowed roots after checking a path"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PathConfinement>> PathConfinement::Create(
    const std::vector<std::string>& roots) {
  // No roots (a daemon whose roots are all s3:// prefixes): every open is refused.
  std::shared_ptr<PathConfinement> confinement(new PathConfinement());
  for (const std::string& root : roots) {
    ASSIGN_OR_RETURN(const std::string resolved, RealPath(root), "allowed root");
    const int fd = ::open(resolved.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      return ErrnoToStatus(errno, absl::StrCat("allowed root ", root, " is not a folder"));
    }
    confinement->root_handles_.push_back({StripTrailingSlashes(resolved), fd});
    confinement->roots_.push_back(StripTrailingSlashes(resolved));
  }
  return std::shared_ptr<const PathConfinement>(std::move(confinement));
}

PathConfinement::~PathConfinement() {
  for (const Root& root : root_handles_) ::close(root.fd);
}

const PathConfinement::Root* PathConfinement::Find(const std::string& path,
                                                   std::string* relative) const {
  const Root* best = nullptr;
  for (const Root& root : root_handles_) {
    std::string rest;
    if (path == root.path) {
      rest = "";
    } else {
      const std::string prefix = root.path == "/" ? "/" : root.path + "/";
      if (path.compare(0, prefix.size(), prefix) != 0) continue;
      rest = path.substr(prefix.size());
    }
    if (best == nullptr || root.path.size() > best->path.size()) {
      best = &root;
      *relative = rest;
    }
  }
  return best;
}

absl::StatusOr<int> PathConfinement::Open(const std::string& path, int flags) const {
  auto resolved = RealPath(path);
  if (!resolved.ok()) {
    if (absl::IsNotFound(resolved.status())) {
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    }
    return resolved.status();
  }
  std::string relative;
  const Root* root = Find(*resolved, &relative);
  if (root == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(path, " resolves to ", *resolved,
                                                    ", outside the allowed roots (",
                                                    absl::StrJoin(roots_, ", "), ")"));
  }
  const int fd = OpenBeneath(root->fd, relative, flags);
  if (fd < 0) {
    if (errno == ELOOP || errno == EXDEV || errno == ENOTDIR) {
      return ChangedUnderneath(path, *resolved);
    }
    return ErrnoToStatus(errno, absl::StrCat("opening ", path));
  }
  return fd;
}

absl::StatusOr<Directory> PathConfinement::OpenFolder(const std::string& path, bool create) const {
  std::string relative;
  const Root* root = Find(StripTrailingSlashes(path), &relative);
  if (root == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "folder ", path, " is outside the allowed roots (", absl::StrJoin(roots_, ", "), ")"));
  }
  const int fd = ::openat(root->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening allowed root ", root->path));
  Directory dir = Directory::Adopt(fd, root->path);
  for (absl::string_view part : absl::StrSplit(relative, '/', absl::SkipEmpty())) {
    ASSIGN_OR_RETURN(dir, dir.OpenChild(part, create), absl::StrCat("opening folder ", path));
  }
  return dir;
}

ScopedPathConfinement::ScopedPathConfinement(const PathConfinement* confinement)
    : previous_(current_confinement) {
  current_confinement = confinement;
}

ScopedPathConfinement::~ScopedPathConfinement() { current_confinement = previous_; }

const PathConfinement* CurrentPathConfinement() { return current_confinement; }

absl::StatusOr<int> OpenRegularFile(const std::string& path) {
  if (kvstore::HasScheme(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is a storage URL, not a local file: it is read through its kvstore driver"));
  }
  constexpr int kFlags = O_RDONLY | O_NONBLOCK | O_NOCTTY;
  int fd;
  if (const PathConfinement* confinement = CurrentPathConfinement()) {
    ASSIGN_OR_RETURN(fd, confinement->Open(path, kFlags));
  } else {
    fd = ::open(path.c_str(), kFlags | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("opening ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoToStatus(error, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", DescribeFileType(st.st_mode),
                                                   ", not a regular file; reshard reads "
                                                   "regular files only"));
  }
  const int status_flags = ::fcntl(fd, F_GETFL);
  if (status_flags < 0 || ::fcntl(fd, F_SETFL, status_flags & ~O_NONBLOCK) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoToStatus(error, absl::StrCat("opening ", path));
  }
  return fd;
}

absl::StatusOr<Directory> OpenFolderCreating(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty folder name");
  if (const PathConfinement* confinement = CurrentPathConfinement()) {
    return confinement->OpenFolder(path, /*create=*/true);
  }
  // The deepest existing ancestor (symlinks followed: the user named this path), then the
  // missing folders created and opened one handle at a time.
  namespace fs = std::filesystem;
  std::vector<std::string> missing;
  std::string existing = fs::path(path).lexically_normal().string();
  existing = StripTrailingSlashes(existing);
  struct stat st;
  while (::stat(existing.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoToStatus(errno, absl::StrCat("checking folder ", existing));
    const size_t slash = existing.rfind('/');
    if (slash == std::string::npos) {
      missing.insert(missing.begin(), existing);
      existing = ".";
      break;
    }
    missing.insert(missing.begin(), existing.substr(slash + 1));
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  ASSIGN_OR_RETURN(Directory dir, Directory::Open(existing));
  for (const std::string& name : missing) {
    if (name.empty()) continue;
    ASSIGN_OR_RETURN(dir, dir.OpenChild(name, /*create=*/true));
  }
  return dir;
}

absl::StatusOr<Directory> OpenExistingFolder(const std::string& path) {
  if (const PathConfinement* confinement = CurrentPathConfinement()) {
    return confinement->OpenFolder(path, /*create=*/false);
  }
  return Directory::Open(path);
}

void DisableOpenat2ForTesting(bool disable) { openat2_unavailable.store(disable); }

}  // namespace reshard
