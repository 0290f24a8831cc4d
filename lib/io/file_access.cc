#include "lib/io/file_access.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"
#include "lib/io/remote_store.h"

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

}  // namespace

struct ScopedRemoteListingCache::Cache {
  std::map<std::string, absl::StatusOr<RemoteStat>> stats;
  std::map<std::string, absl::StatusOr<RemoteListing>> listings;  // by folder URL
};

namespace {

thread_local ScopedRemoteListingCache::Cache* remote_cache = nullptr;

// The folder holding remote path `url` and the name in it ("s3://b/x", "y" for "s3://b/x/y"),
// or nullopt for a bucket, a URL ending in '/', or one without a scheme.
std::optional<std::pair<std::string, std::string>> SplitRemote(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t slash = url.rfind('/');
  if (scheme == std::string::npos || slash == std::string::npos || slash < scheme + 3 ||
      slash + 1 == url.size()) {
    return std::nullopt;
  }
  const std::string parent = url.substr(0, slash);
  if (parent.size() <= scheme + 3 || parent.back() == '/') return std::nullopt;
  return std::make_pair(parent, url.substr(slash + 1));
}

// What remote folder `dir` holds (remembered in scope).
absl::StatusOr<RemoteListing> ListRemote(const std::string& dir) {
  ScopedRemoteListingCache::Cache* cache = remote_cache;
  if (cache != nullptr) {
    if (auto it = cache->listings.find(dir); it != cache->listings.end()) return it->second;
  }
  ASSIGN_OR_RETURN(RemoteStore * store, RemoteStoreFor(dir));
  absl::StatusOr<RemoteListing> listing = store->ListEntries(dir);
  if (cache != nullptr && !dir.empty() && dir.back() != '/') {
    cache->listings.emplace(dir, listing);
    if (listing.ok() && (!listing->files.empty() || !listing->folders.empty())) {
      cache->stats.emplace(dir, RemoteStat{/*is_folder=*/true, 0});
    }
  }
  return listing;
}

// The store's Stat of remote path `path`; in scope, remembered, and answered from the listing
// of its folder when that is known to be one.
absl::StatusOr<RemoteStat> StatRemote(const std::string& path) {
  ScopedRemoteListingCache::Cache* cache = remote_cache;
  if (cache == nullptr) {
    ASSIGN_OR_RETURN(RemoteStore * store, RemoteStoreFor(path));
    return store->Stat(path);
  }
  if (auto it = cache->stats.find(path); it != cache->stats.end()) return it->second;
  if (std::optional<std::pair<std::string, std::string>> split = SplitRemote(path)) {
    const auto& [parent, name] = *split;
    auto known = cache->stats.find(parent);
    const bool parent_is_folder =
        known != cache->stats.end() && known->second.ok() && known->second->is_folder;
    if (parent_is_folder || cache->listings.count(parent) > 0) {
      absl::StatusOr<RemoteListing> listing = ListRemote(parent);
      if (listing.ok()) {
        absl::StatusOr<RemoteStat> stat = absl::NotFoundError(absl::StrCat(
            path, " does not exist: no object or folder \"", name, "\" in ", parent, "/"));
        for (const RemoteEntry& file : listing->files) {
          if (file.name == name) stat = RemoteStat{/*is_folder=*/false, file.size, file.version};
        }
        for (const std::string& folder : listing->folders) {
          if (folder == name) stat = RemoteStat{/*is_folder=*/true, 0};
        }
        cache->stats.emplace(path, stat);
        return stat;
      }
    }
  }
  ASSIGN_OR_RETURN(RemoteStore * store, RemoteStoreFor(path));
  absl::StatusOr<RemoteStat> stat = store->Stat(path);
  cache->stats.emplace(path, stat);
  return stat;
}

// Up to `max_bytes` + 1 bytes from the start of remote file `path` (+1 to tell a longer file,
// as ReadUpTo does).
absl::StatusOr<std::string> ReadRemotePrefix(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(RemoteStore * store, RemoteStoreFor(path));
  ASSIGN_OR_RETURN(RemoteStat stat, StatRemote(path));
  if (stat.is_folder) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a folder, not a file"));
  }
  std::string contents(static_cast<size_t>(stat.size > max_bytes ? max_bytes + 1 : stat.size),
                       '\0');
  RETURN_IF_ERROR(store->ReadRange(path, 0, absl::MakeSpan(contents), stat));
  return contents;
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

absl::Status CheckInputFileType(const std::string& path) {
  if (IsRemotePath(path)) return StatRemote(path).status();
  struct stat st;
  if (const PathConfinement* confinement = CurrentPathConfinement()) {
    // O_PATH: nothing is really opened, so a FIFO or device is only looked at.
    ASSIGN_OR_RETURN(int fd, confinement->Open(path, O_PATH));
    const int result = ::fstat(fd, &st);
    const int error = errno;
    ::close(fd);
    if (result != 0) return ErrnoToStatus(error, absl::StrCat("stat ", path));
  } else if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat("input ", path, " does not exist"));
    return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input ", path, " is ", DescribeFileType(st.st_mode),
                     "; reshard reads regular files and folders only"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> OpenRegularFile(const std::string& path) {
  RETURN_IF_ERROR(CheckLocalPath(path, "input"));
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

namespace {

// Reads `fd` (closed here) to its end, or up to `max_bytes` (+1 to tell a longer file).
absl::StatusOr<std::string> ReadUpTo(int fd, const std::string& path, uint64_t max_bytes) {
  std::string contents;
  char buffer[8192];
  while (contents.size() <= max_bytes) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(sizeof(buffer), max_bytes + 1 - contents.size()));
    const ssize_t n = ::read(fd, buffer, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      return ErrnoToStatus(error, absl::StrCat("reading ", path));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return contents;
}

// Up to `max_bytes` + 1 bytes from the start of input file `path`, local or remote.
absl::StatusOr<std::string> ReadInputUpTo(const std::string& path, uint64_t max_bytes) {
  if (IsRemotePath(path)) return ReadRemotePrefix(path, max_bytes);
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path));
  return ReadUpTo(fd, path, max_bytes);
}

}  // namespace

absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes) {
  ASSIGN_OR_RETURN(std::string contents, ReadInputUpTo(path, max_bytes));
  if (contents.size() > max_bytes) contents.resize(max_bytes);
  return contents;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::string contents, ReadInputUpTo(path, max_bytes));
  if (contents.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is larger than ", max_bytes, " bytes; not a file reshard reads"));
  }
  return contents;
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

bool IsRemotePath(const std::string& path) {
  const size_t colon = path.find("://");
  if (colon == std::string::npos || colon == 0) return false;
  if (!absl::ascii_isalpha(static_cast<unsigned char>(path[0]))) return false;
  for (size_t i = 1; i < colon; ++i) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (!absl::ascii_isalnum(c) && c != '+' && c != '.' && c != '-') return false;
  }
  return true;
}

absl::Status CheckLocalPath(const std::string& path, const std::string& what) {
  if (!IsRemotePath(path)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " ", path, " is a remote storage URL (", path.substr(0, path.find("://") + 3),
      "); reshard reads and writes local (or mounted) paths only for now"));
}

absl::Status CheckInputPath(const std::string& path, const std::string& what) {
  if (!IsRemotePath(path)) return absl::OkStatus();
  return Annotate(RemoteStoreFor(path).status(), what);
}

namespace {

enum class InputKind { kAbsent, kFolder, kFile, kOther };

// What input `path` is (symlinks followed); NotFound is kAbsent, other failures are errors
// naming the path.
absl::StatusOr<InputKind> StatInput(const std::string& path) {
  if (IsRemotePath(path)) {
    absl::StatusOr<RemoteStat> stat = StatRemote(path);
    if (absl::IsNotFound(stat.status())) return InputKind::kAbsent;
    if (!stat.ok()) return Annotate(stat.status(), absl::StrCat("looking up ", path));
    return stat->is_folder ? InputKind::kFolder : InputKind::kFile;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    // ENOTDIR: a component of the path is a file, so nothing is there either.
    if (error == ENOENT || error == ENOTDIR) return InputKind::kAbsent;
    return ErrnoToStatus(error, absl::StrCat("stat ", path));
  }
  if (S_ISDIR(st.st_mode)) return InputKind::kFolder;
  return S_ISREG(st.st_mode) ? InputKind::kFile : InputKind::kOther;
}

}  // namespace

absl::StatusOr<bool> CheckInputFolder(const std::string& path) {
  ASSIGN_OR_RETURN(InputKind kind, StatInput(path));
  return kind == InputKind::kFolder;
}

absl::StatusOr<bool> CheckInputExists(const std::string& path) {
  ASSIGN_OR_RETURN(InputKind kind, StatInput(path));
  return kind != InputKind::kAbsent;
}

absl::StatusOr<bool> CheckInputFile(const std::string& path) {
  ASSIGN_OR_RETURN(InputKind kind, StatInput(path));
  return kind == InputKind::kFile;
}

absl::StatusOr<uint64_t> InputFileSize(const std::string& path) {
  ASSIGN_OR_RETURN(InputFileInfo info, StatInputFile(path));
  return info.size;
}

absl::StatusOr<InputFileInfo> StatInputFile(const std::string& path) {
  if (IsRemotePath(path)) {
    ASSIGN_OR_RETURN(RemoteStat stat, StatRemote(path));
    if (stat.is_folder) {
      return absl::InvalidArgumentError(absl::StrCat(path, " is a folder, not a file"));
    }
    return InputFileInfo{stat.size, std::move(stat.version)};
  }
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot stat: ", error ? error.message() : "no such file"));
  }
  if (!fs::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const uint64_t size = fs::file_size(path, error);
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("stat ", path));
  return InputFileInfo{size, ""};
}

absl::StatusOr<std::vector<std::string>> ListInputFolderEntries(const std::string& dir) {
  if (IsRemotePath(dir)) return ListInputFolder(dir);
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    names.push_back(it->path().filename().string());
  }
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing folder ", dir));
  return names;
}

absl::StatusOr<std::vector<std::string>> ListInputSubfolders(const std::string& dir) {
  if (IsRemotePath(dir)) {
    ASSIGN_OR_RETURN(RemoteListing listing, ListRemote(dir));
    return std::move(listing.folders);
  }
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    std::error_code entry_error;
    if (entry.is_directory(entry_error)) names.push_back(entry.path().filename().string());
  }
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing folder ", dir));
  return names;
}

absl::StatusOr<std::vector<std::string>> ListInputFolder(const std::string& dir) {
  std::vector<std::string> names;
  if (IsRemotePath(dir)) {
    ASSIGN_OR_RETURN(RemoteListing listing, ListRemote(dir));
    for (RemoteEntry& entry : listing.files) names.push_back(std::move(entry.name));
    return names;
  }
  namespace fs = std::filesystem;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    std::error_code entry_error;
    if (it->is_regular_file(entry_error)) {
      names.push_back(it->path().filename().string());
    } else if (entry_error && entry_error.value() != ENOENT) {
      // A dangling symlink names nothing and is skipped; an entry that cannot be looked at (a
      // symlink loop, no permission) is named.
      return ErrnoToStatus(entry_error.value(), absl::StrCat("stat ", it->path().string()));
    }
  }
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing folder ", dir));
  return names;
}

ScopedRemoteListingCache::ScopedRemoteListingCache() {
  if (remote_cache == nullptr) {
    cache_ = std::make_unique<Cache>();
    remote_cache = cache_.get();
  }
}

ScopedRemoteListingCache::~ScopedRemoteListingCache() {
  if (cache_ != nullptr) remote_cache = nullptr;
}

void DisableOpenat2ForTesting(bool disable) { openat2_unavailable.store(disable); }

}  // namespace reshard
