#include "lib/io/staging_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/atomic_file.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

std::string Normalize(const std::string& path) {
  std::string result = fs::path(path).lexically_normal().string();
  while (result.size() > 1 && result.back() == '/') result.pop_back();
  return result;
}

// Opens and flocks `dir`; returns -1 with errno EWOULDBLOCK when another process holds it.
int LockDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

}  // namespace

std::string StagingPathFor(const std::string& output_dir) {
  fs::path out(Normalize(output_dir));
  return (out.parent_path() / absl::StrCat(".", out.filename().string(), ".reshard-staging"))
      .string();
}

absl::Status CheckOutputDirUsable(const std::string& output_dir) {
  std::error_code error;
  fs::file_status status = fs::symlink_status(output_dir, error);
  if (error || status.type() == fs::file_type::not_found) return absl::OkStatus();
  if (status.type() != fs::file_type::directory) {
    return absl::FailedPreconditionError(
        absl::StrCat("output ", output_dir, " exists and is not a folder"));
  }
  if (!fs::is_empty(output_dir, error) || error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output folder ", output_dir,
        " is not empty; choose a new folder (reshard never overwrites existing output)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StagingDir> StagingDir::Create(const std::string& output_dir,
                                              const StagingOptions& options) {
  if (output_dir.empty()) return absl::InvalidArgumentError("empty output folder name");
  const std::string out = Normalize(output_dir);
  if (!options.overwrite) RETURN_IF_ERROR(CheckOutputDirUsable(out));
  std::error_code error;
  fs::path parent = fs::path(out).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, error);
    if (error) {
      return ErrnoToStatus(error.value(), absl::StrCat("creating folder ", parent.string()));
    }
  }
  StagingDir staging;
  staging.output_dir_ = out;
  staging.path_ = StagingPathFor(out);
  staging.overwrite_ = options.overwrite;
  // Until this run owns the folder (created it, or locked a stale one) an early return must not
  // let the destructor remove it: it may be another run's, locked and in use.
  staging.published_ = true;
  if (fs::exists(fs::symlink_status(staging.path_, error))) {
    int fd = LockDirectory(staging.path_);
    if (fd < 0) {
      if (errno == EWOULDBLOCK) {
        return absl::FailedPreconditionError(absl::StrCat("another reshard run is writing ", out,
                                                          " (its staging folder ", staging.path_,
                                                          " is locked)"));
      }
      return ErrnoToStatus(errno, absl::StrCat("locking stale staging folder ", staging.path_));
    }
    // Left by a run that was killed: nothing in it was ever published.
    if (options.resume) {
      for (const auto& entry : fs::directory_iterator(staging.path_, error)) {
        if (entry.path().extension() == ".partial") fs::remove(entry.path(), error);
      }
      staging.lock_fd_ = fd;
      staging.published_ = false;
      return staging;
    }
    fs::remove_all(staging.path_, error);
    ::close(fd);
    if (error) {
      return ErrnoToStatus(error.value(),
                           absl::StrCat("removing stale staging folder ", staging.path_));
    }
  }
  if (::mkdir(staging.path_.c_str(), 0755) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("creating staging folder ", staging.path_));
  }
  staging.published_ = false;
  staging.lock_fd_ = LockDirectory(staging.path_);
  if (staging.lock_fd_ < 0) {
    int lock_error = errno;
    fs::remove_all(staging.path_, error);
    return ErrnoToStatus(lock_error, absl::StrCat("locking staging folder ", staging.path_));
  }
  return staging;
}

StagingDir::StagingDir(StagingDir&& other) noexcept
    : output_dir_(std::move(other.output_dir_)),
      path_(std::move(other.path_)),
      lock_fd_(std::exchange(other.lock_fd_, -1)),
      published_(std::exchange(other.published_, true)),
      overwrite_(other.overwrite_) {}

StagingDir& StagingDir::operator=(StagingDir&& other) noexcept {
  if (this != &other) {
    Abandon();
    output_dir_ = std::move(other.output_dir_);
    path_ = std::move(other.path_);
    lock_fd_ = std::exchange(other.lock_fd_, -1);
    published_ = std::exchange(other.published_, true);
    overwrite_ = other.overwrite_;
  }
  return *this;
}

StagingDir::~StagingDir() { Abandon(); }

void StagingDir::Abandon() {
  if (!published_ && !path_.empty()) {
    std::error_code error;
    fs::remove_all(path_, error);
  }
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  published_ = true;
}

void StagingDir::Keep() {
  published_ = true;  // nothing to remove
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
}

absl::Status StagingDir::Publish() {
  if (published_) return absl::FailedPreconditionError("staging folder already published");
  RETURN_IF_ERROR(SyncDirectory(path_));
  std::string replaced;  // the previous output, moved aside when overwriting
  if (overwrite_ && !CheckOutputDirUsable(output_dir_).ok()) {
    fs::path out(output_dir_);
    replaced = (out.parent_path() / absl::StrCat(".", out.filename().string(), ".reshard-replaced"))
                   .string();
    std::error_code error;
    fs::remove_all(replaced, error);
    if (::rename(output_dir_.c_str(), replaced.c_str()) != 0) {
      return ErrnoToStatus(
          errno, absl::StrCat("moving the output ", output_dir_, " aside to overwrite it"));
    }
  }
  if (::rename(path_.c_str(), output_dir_.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(
          "output folder ", output_dir_, " was filled by someone else while converting"));
    }
    return ErrnoToStatus(errno, absl::StrCat("renaming ", path_, " to ", output_dir_));
  }
  published_ = true;
  if (lock_fd_ >= 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
  }
  if (!replaced.empty()) {
    std::error_code error;
    fs::remove_all(replaced, error);
  }
  std::string parent = fs::path(output_dir_).parent_path().string();
  return SyncDirectory(parent.empty() ? "." : parent);
}

}  // namespace reshard
