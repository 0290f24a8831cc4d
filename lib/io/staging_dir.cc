#include "lib/io/staging_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/atomic_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

// Removes the `.partial` files a killed run left in `dir` and its subfolders (output files may
// sit in subfolders, see CheckRelativeName), walking handles and following no symlink.
absl::Status RemovePartialFiles(const Directory& dir, int depth) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, dir.List());
  for (const std::string& name : names) {
    if (absl::EndsWith(name, ".partial")) {
      RETURN_IF_ERROR(dir.RemoveFile(name));
      continue;
    }
    if (depth + 1 >= kMaxRelativeNameDepth) continue;
    ASSIGN_OR_RETURN(struct stat st, dir.StatChild(name));
    if (!S_ISDIR(st.st_mode)) continue;
    ASSIGN_OR_RETURN(Directory child, dir.OpenChild(name));
    RETURN_IF_ERROR(RemovePartialFiles(child, depth + 1));
  }
  return absl::OkStatus();
}

namespace fs = std::filesystem;

// The staging folder's name for output folder `output_name`.
std::string StagingName(const std::string& output_name) {
  return absl::StrCat(".", output_name, ".reshard-staging");
}

// flock of an open folder; false with errno EWOULDBLOCK when another process holds it.
bool LockDirectory(const Directory& dir) { return ::flock(dir.fd(), LOCK_EX | LOCK_NB) == 0; }

// FailedPrecondition unless `name` in `parent` is absent or an empty folder (never followed).
absl::Status CheckOutputUsableAt(const Directory& parent, const std::string& name,
                                 const std::string& output_dir) {
  auto st = parent.StatChild(name);
  if (!st.ok()) return absl::IsNotFound(st.status()) ? absl::OkStatus() : st.status();
  if (!S_ISDIR(st->st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("output ", output_dir,
                                                      " exists and is not a folder (it is ",
                                                      DescribeFileType(st->st_mode), ")"));
  }
  ASSIGN_OR_RETURN(Directory out, parent.OpenChild(name));
  ASSIGN_OR_RETURN(std::vector<std::string> entries, out.List());
  if (!entries.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output folder ", output_dir,
        " is not empty; choose a new folder, or pass --overwrite to replace its contents"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string NormalizeOutputPath(const std::string& path) {
  std::string result = fs::path(path).lexically_normal().string();
  while (result.size() > 1 && result.back() == '/') result.pop_back();
  return result;
}

OutputLocation SplitOutputPath(const std::string& output_dir) {
  const fs::path out(NormalizeOutputPath(output_dir));
  std::string parent = out.parent_path().string();
  return {parent.empty() ? "." : parent, out.filename().string()};
}

std::string StagingPathFor(const std::string& output_dir) {
  const OutputLocation out = SplitOutputPath(output_dir);
  return (fs::path(out.parent) / StagingName(out.name)).string();
}

absl::Status CheckOutputDirUsable(const std::string& output_dir) {
  const OutputLocation out = SplitOutputPath(output_dir);
  absl::StatusOr<Directory> parent = OpenExistingFolder(out.parent);
  if (absl::IsNotFound(parent.status())) return absl::OkStatus();  // created when publishing
  if (!parent.ok()) return parent.status();
  return CheckOutputUsableAt(*parent, out.name, NormalizeOutputPath(output_dir));
}

absl::StatusOr<StagingDir> StagingDir::Create(const std::string& output_dir,
                                              const StagingOptions& options) {
  if (output_dir.empty()) return absl::InvalidArgumentError("empty output folder name");
  const std::string out = NormalizeOutputPath(output_dir);
  const OutputLocation location = SplitOutputPath(out);
  StagingDir staging;
  staging.output_dir_ = out;
  staging.output_name_ = location.name;
  staging.parent_path_ = location.parent;
  if (!CheckPlainName(staging.output_name_).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", output_dir, " does not end in a folder name"));
  }
  staging.staging_name_ = StagingName(staging.output_name_);
  staging.overwrite_ = options.overwrite;
  // Until this run owns the folder (created it, or locked a stale one) an early return must not
  // let the destructor remove it: it may be another run's, locked and in use.
  staging.published_ = true;
  ASSIGN_OR_RETURN(staging.parent_, OpenFolderCreating(staging.parent_path_));
  const Directory& parent = staging.parent_;
  if (!options.overwrite) {
    RETURN_IF_ERROR(CheckOutputUsableAt(parent, staging.output_name_, out));
  }
  const std::string staging_path = staging.path();
  auto existing = parent.StatChild(staging.staging_name_);
  if (existing.ok() && !S_ISDIR(existing->st_mode)) {
    // Not ours (a file or a symlink under our name): the name goes, a link's target stays.
    RETURN_IF_ERROR(parent.RemoveFile(staging.staging_name_));
  } else if (existing.ok()) {
    ASSIGN_OR_RETURN(Directory stale, parent.OpenChild(staging.staging_name_));
    if (!LockDirectory(stale)) {
      if (errno == EWOULDBLOCK) {
        return absl::FailedPreconditionError(absl::StrCat("another reshard run is writing ", out,
                                                          " (its staging folder ", staging_path,
                                                          " is locked)"));
      }
      return ErrnoToStatus(errno, absl::StrCat("locking stale staging folder ", staging_path));
    }
    // Left by a run that was killed: nothing in it was ever published.
    if (options.resume) {
      RETURN_IF_ERROR(RemovePartialFiles(stale, 0));
      staging.dir_ = std::move(stale);
      staging.published_ = false;
      return staging;
    }
    RETURN_IF_ERROR(parent.RemoveTree(staging.staging_name_), "removing stale staging folder");
  } else if (!absl::IsNotFound(existing.status())) {
    return existing.status();
  }
  if (::mkdirat(parent.fd(), staging.staging_name_.c_str(), 0755) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("creating staging folder ", staging_path));
  }
  auto created = parent.OpenChild(staging.staging_name_);
  if (!created.ok()) {
    parent.RemoveTree(staging.staging_name_).IgnoreError();
    return created.status();
  }
  staging.dir_ = *std::move(created);
  staging.published_ = false;
  if (!LockDirectory(staging.dir_)) {
    const int lock_error = errno;
    staging.dir_ = Directory();
    staging.published_ = true;
    parent.RemoveTree(staging.staging_name_).IgnoreError();
    return ErrnoToStatus(lock_error, absl::StrCat("locking staging folder ", staging_path));
  }
  return staging;
}

StagingDir::StagingDir(StagingDir&& other) noexcept
    : output_dir_(std::move(other.output_dir_)),
      parent_path_(std::move(other.parent_path_)),
      output_name_(std::move(other.output_name_)),
      staging_name_(std::move(other.staging_name_)),
      parent_(std::move(other.parent_)),
      dir_(std::move(other.dir_)),
      published_(std::exchange(other.published_, true)),
      overwrite_(other.overwrite_) {}

StagingDir& StagingDir::operator=(StagingDir&& other) noexcept {
  if (this != &other) {
    Abandon();
    output_dir_ = std::move(other.output_dir_);
    parent_path_ = std::move(other.parent_path_);
    output_name_ = std::move(other.output_name_);
    staging_name_ = std::move(other.staging_name_);
    parent_ = std::move(other.parent_);
    dir_ = std::move(other.dir_);
    published_ = std::exchange(other.published_, true);
    overwrite_ = other.overwrite_;
  }
  return *this;
}

StagingDir::~StagingDir() { Abandon(); }

void StagingDir::Abandon() {
  if (!published_ && dir_.is_open() && parent_.is_open()) {
    // Through the parent's handle: the folder this run created, wherever its path points now.
    parent_.RemoveTree(staging_name_).IgnoreError();
  }
  dir_ = Directory();  // releases the lock
  published_ = true;
}

void StagingDir::Keep() {
  published_ = true;  // nothing to remove
  dir_ = Directory();
}

absl::Status StagingDir::CheckParentInPlace() const {
  auto replaced = [&](absl::string_view how) {
    return absl::PermissionDeniedError(absl::StrCat("the output's folder ", parent_path_,
                                                    " was moved or replaced while converting (",
                                                    how, "); nothing was published"));
  };
  absl::StatusOr<Directory> now = OpenExistingFolder(parent_path_);
  if (!now.ok()) return replaced(now.status().message());
  ASSIGN_OR_RETURN(struct stat then_stat, parent_.Stat());
  ASSIGN_OR_RETURN(struct stat now_stat, now->Stat());
  if (then_stat.st_dev != now_stat.st_dev || then_stat.st_ino != now_stat.st_ino) {
    return replaced("its path now leads to another folder");
  }
  return absl::OkStatus();
}

absl::Status StagingDir::Publish() {
  if (published_) return absl::FailedPreconditionError("staging folder already published");
  RETURN_IF_ERROR(dir_.Sync());
  RETURN_IF_ERROR(CheckParentInPlace());
  std::string replaced;  // the previous output, moved aside when overwriting
  if (overwrite_ && !CheckOutputUsableAt(parent_, output_name_, output_dir_).ok()) {
    replaced = absl::StrCat(".", output_name_, ".reshard-replaced");
    RETURN_IF_ERROR(parent_.RemoveTree(replaced));
    if (::renameat(parent_.fd(), output_name_.c_str(), parent_.fd(), replaced.c_str()) != 0) {
      return ErrnoToStatus(
          errno, absl::StrCat("moving the output ", output_dir_, " aside to overwrite it"));
    }
  }
  if (::renameat(parent_.fd(), staging_name_.c_str(), parent_.fd(), output_name_.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(
          "output folder ", output_dir_, " was filled by someone else while converting"));
    }
    return ErrnoToStatus(errno, absl::StrCat("renaming ", path(), " to ", output_dir_));
  }
  published_ = true;
  dir_ = Directory();  // releases the lock
  if (!replaced.empty()) parent_.RemoveTree(replaced).IgnoreError();
  return parent_.Sync();
}

}  // namespace reshard
