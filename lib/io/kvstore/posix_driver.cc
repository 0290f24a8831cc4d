#include "lib/io/kvstore/posix_driver.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/atomic_file.h"
#include "lib/io/directory.h"
#include "lib/io/path_confinement.h"

namespace reshard {
namespace kvstore {
namespace {

// The folder holding `path` and the name in it ("." and "x" for "x").
std::pair<std::string, std::string> SplitParent(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.rfind('/');
  if (slash == std::string::npos) return {".", trimmed};
  return {slash == 0 ? "/" : trimmed.substr(0, slash), trimmed.substr(slash + 1)};
}

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return ErrnoToStatus(errno, absl::StrCat("resolving ", path));
  }
  return std::string(resolved);
}

PathStat FromStat(const struct stat& st) {
  PathStat stat;
  stat.is_folder = S_ISDIR(st.st_mode);
  if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) stat.special = DescribeFileType(st.st_mode);
  stat.size = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  if (S_ISREG(st.st_mode)) {
    const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                             static_cast<int64_t>(st.st_mtim.tv_nsec);
    stat.generation = absl::StrCat(static_cast<uint64_t>(st.st_ino), ":", mtime_ns, ":",
                                   stat.size);
  }
  return stat;
}

// Closes its descriptor.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  const int fd_;
};

// A Writer over an AtomicFile in the parent folder.
class PosixWriter final : public Writer {
 public:
  PosixWriter(Directory dir, AtomicFile file) : dir_(std::move(dir)), file_(std::move(file)) {}

  absl::Status Append(absl::string_view data) override {
    if (aborted_) return absl::FailedPreconditionError(absl::StrCat(path(), ": writer aborted"));
    return file_.Append(data);
  }
  absl::StatusOr<std::string> Commit() override {
    if (aborted_) return absl::FailedPreconditionError(absl::StrCat(path(), ": writer aborted"));
    RETURN_IF_ERROR(file_.Commit());
    return std::string();
  }
  void Abort() override {
    aborted_ = true;
    file_ = AtomicFile();  // removes the partial file
  }
  uint64_t pos() const override { return file_.bytes_written(); }

 private:
  const std::string& path() const { return file_.final_path(); }

  Directory dir_;  // open while the file is written
  AtomicFile file_;
  bool aborted_ = false;
};

std::atomic<uint64_t> exclusive_counter{0};

}  // namespace

absl::StatusOr<PathStat> PosixDriver::Stat(const std::string& path) const {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    // ENOTDIR: a component of the path is a file, so nothing is there either.
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    }
    return ErrnoToStatus(error, absl::StrCat("stat ", path));
  }
  if (const PathConfinement* confinement = CurrentPathConfinement()) {
    // O_PATH: nothing is really opened, so a FIFO or device is only looked at.
    ASSIGN_OR_RETURN(int fd, confinement->Open(path, O_PATH));
    FdCloser closer(fd);
    if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", path));
  }
  return FromStat(st);
}

bool PosixDriver::IsAbsolute(absl::string_view path) const {
  return !path.empty() && path[0] == '/';
}

std::string PosixDriver::AbsolutePath(const std::string& path) const {
  if (path.empty()) return path;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  std::string result =
      std::filesystem::path(error ? path : absolute.string()).lexically_normal().string();
  while (result.size() > 1 && result.back() == '/') result.pop_back();
  return result;
}

absl::StatusOr<std::string> PosixDriver::ConfinedPath(const std::string& path,
                                                      bool must_exist) const {
  if (must_exist) {
    absl::StatusOr<std::string> resolved = RealPath(path);
    if (absl::IsNotFound(resolved.status())) {
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    }
    return resolved;
  }
  // The deepest existing ancestor, and the plain names below it.
  std::vector<std::string> missing;
  std::string existing = path;
  while (existing.size() > 1 && existing.back() == '/') existing.pop_back();
  struct stat st;
  while (::lstat(existing.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoToStatus(errno, absl::StrCat("checking ", path));
    const size_t slash = existing.rfind('/');
    if (slash == std::string::npos) {
      existing = ".";
      break;
    }
    std::string name = existing.substr(slash + 1);
    if (name == "." || name == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat(path, " uses \"", name, "\" below an existing folder"));
    }
    if (!name.empty()) missing.insert(missing.begin(), name);
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  absl::StatusOr<std::string> real_existing = RealPath(existing);
  if (!real_existing.ok()) {
    // lstat found it, realpath cannot follow it: a dangling symlink, wherever it points.
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": ", existing, " is a symlink that cannot be resolved (",
                     real_existing.status().message(), ")"));
  }
  std::string resolved = *std::move(real_existing);
  for (const std::string& name : missing) {
    resolved = resolved == "/" ? "/" + name : resolved + "/" + name;
  }
  return resolved;
}

absl::StatusOr<Listing> PosixDriver::List(const std::string& path) const {
  namespace fs = std::filesystem;
  Listing listing;
  std::error_code error;
  for (fs::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    struct stat st;
    if (::stat(it->path().c_str(), &st) != 0) {
      // A dangling symlink names nothing and is skipped; an entry that cannot be looked at (a
      // symlink loop, no permission) is named.
      if (errno == ENOENT) continue;
      return ErrnoToStatus(errno, absl::StrCat("stat ", it->path().string()));
    }
    if (S_ISREG(st.st_mode)) {
      listing.files.push_back(FileEntry{name, static_cast<uint64_t>(st.st_size), ""});
    } else if (S_ISDIR(st.st_mode)) {
      listing.folders.push_back(name);
    } else {
      listing.others.push_back(name);
    }
  }
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing folder ", path));
  std::sort(listing.files.begin(), listing.files.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.name < b.name; });
  std::sort(listing.folders.begin(), listing.folders.end());
  std::sort(listing.others.begin(), listing.others.end());
  return listing;
}

absl::Status PosixDriver::ReadRange(const std::string& path, uint64_t offset,
                                    absl::Span<char> out, const PathStat& opened) const {
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path));
  FdCloser closer(fd);
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("reading ", path, " at byte offset ", offset + done));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path, ": file ended at byte offset ", offset + done,
                                              " while reading ", out.size(), " bytes at ",
                                              offset));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status PosixDriver::CreateExclusive(const std::string& path,
                                          absl::string_view bytes) const {
  const auto [parent, name] = SplitParent(path);
  ASSIGN_OR_RETURN(Directory dir, OpenFolderCreating(parent), absl::StrCat("creating ", path));
  // The bytes are written under a name no other writer uses, then linked under `name`: link(2)
  // fails with EEXIST when something is there, and the file never appears half-written.
  const std::string temp = absl::StrCat(".", name, ".exclusive.", ::getpid(), ".",
                                        exclusive_counter.fetch_add(1));
  ASSIGN_OR_RETURN(int fd, dir.OpenFile(temp, O_WRONLY | O_CREAT | O_EXCL, 0644),
                   absl::StrCat("creating ", path));
  absl::Status status;
  {
    FdCloser closer(fd);
    size_t done = 0;
    while (status.ok() && done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) status = ErrnoToStatus(errno, absl::StrCat("writing ", path));
      if (n > 0) done += static_cast<size_t>(n);
    }
    if (status.ok() && ::fsync(fd) != 0) status = ErrnoToStatus(errno, absl::StrCat("fsync ", path));
  }
  if (status.ok() && ::linkat(dir.fd(), temp.c_str(), dir.fd(), name.c_str(), 0) != 0) {
    status = errno == EEXIST
                 ? absl::AlreadyExistsError(absl::StrCat(path, " already exists"))
                 : ErrnoToStatus(errno, absl::StrCat("creating ", path));
  }
  const absl::Status removed = dir.RemoveFile(temp);
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(removed);
  return dir.Sync();
}

absl::StatusOr<std::unique_ptr<Writer>> PosixDriver::Write(
    const std::string& path, const WriteOptions& /*options*/) const {
  const auto [parent, name] = SplitParent(path);
  ASSIGN_OR_RETURN(Directory dir, OpenFolderCreating(parent), absl::StrCat("writing ", path));
  ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::Create(dir, name));
  return std::unique_ptr<Writer>(new PosixWriter(std::move(dir), std::move(file)));
}

absl::StatusOr<std::string> PosixDriver::WriteFileUnsynced(const std::string& path,
                                                           absl::string_view bytes) const {
  const auto [parent, name] = SplitParent(path);
  ASSIGN_OR_RETURN(Directory dir, OpenFolderCreating(parent), absl::StrCat("writing ", path));
  RETURN_IF_ERROR(WriteFileAtomically(dir, name, bytes, CommitMode::kVisible));
  return std::string();  // the generation is Stat's (PathStat::generation)
}

absl::Status PosixDriver::Delete(const std::string& path) const {
  const auto [parent, name] = SplitParent(path);
  absl::StatusOr<Directory> dir = OpenExistingFolder(parent);
  if (absl::IsNotFound(dir.status())) return absl::OkStatus();
  if (!dir.ok()) return Annotate(dir.status(), absl::StrCat("deleting ", path));
  return dir->RemoveFile(name);
}

const PosixDriver& GetPosixDriver() {
  static const PosixDriver* driver = new PosixDriver;
  return *driver;
}

}  // namespace kvstore
}  // namespace reshard
