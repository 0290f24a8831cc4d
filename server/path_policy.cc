#include "server/path_policy.h"

#include <sys/stat.h>

#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/io/directory.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/posix_driver.h"

namespace reshard {
namespace {

constexpr size_t kMaxPathLength = 4096;

// Whether `path` is `root` or lies below it by whole segments.
bool IsAtOrBelow(const std::string& path, const std::string& root) {
  if (path == root) return true;
  const std::string prefix = !root.empty() && root.back() == '/' ? root : root + "/";
  return path.compare(0, prefix.size(), prefix) == 0;
}

// The Location of `path`; InvalidArgument naming it when no driver here serves its scheme.
absl::StatusOr<kvstore::Location> Parse(const std::string& path, absl::string_view what) {
  absl::StatusOr<kvstore::Location> location = kvstore::ParseLocation(path);
  if (!location.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", location.status().message()));
  }
  return location;
}

}  // namespace

absl::StatusOr<PathPolicy> PathPolicy::Create(const std::vector<std::string>& roots) {
  if (roots.empty()) {
    return absl::InvalidArgumentError("at least one --allowed-root is required");
  }
  PathPolicy policy;
  std::vector<std::string> posix_roots;
  const kvstore::Driver* const posix = &kvstore::GetPosixDriver();
  for (const std::string& root : roots) {
    if (root.size() > kMaxPathLength) {
      return absl::InvalidArgumentError(
          absl::StrCat("allowed root path is longer than ", kMaxPathLength));
    }
    ASSIGN_OR_RETURN(kvstore::Location location, Parse(root, "allowed root"));
    ASSIGN_OR_RETURN(location.path, location.driver->ConfinedPath(root, /*must_exist=*/true),
                     "allowed root");
    if (location.driver->has_folders()) {
      // A store with folders of its own: the root must be one (a prefix of keys is a folder
      // as soon as a key is written below it).
      absl::StatusOr<kvstore::PathStat> stat = location.driver->Stat(location.path);
      if (!stat.ok() || !stat->is_folder) {
        return absl::InvalidArgumentError(absl::StrCat("allowed root ", root, " is not a folder"));
      }
    }
    if (location.driver == posix) posix_roots.push_back(location.path);
    policy.roots_.push_back(location.path);
    policy.locations_.push_back(std::move(location));
  }
  // With object-store roots only, the confinement has no roots: every local open is refused.
  ASSIGN_OR_RETURN(policy.confinement_, PathConfinement::Create(posix_roots));
  return policy;
}

absl::StatusOr<kvstore::Location> PathPolicy::Confine(const std::string& path,
                                                      absl::string_view what,
                                                      bool must_exist) const {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " path is empty"));
  if (path.size() > kMaxPathLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " path is longer than ", kMaxPathLength));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " path contains a NUL byte"));
  }
  ASSIGN_OR_RETURN(kvstore::Location location, Parse(path, what));
  if (!location.driver->IsAbsolute(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " path \"", path, "\" is not absolute; the daemon needs absolute paths"));
  }
  absl::StatusOr<std::string> confined = location.driver->ConfinedPath(path, must_exist);
  if (!confined.ok()) {
    if (absl::IsNotFound(confined.status())) {
      return absl::NotFoundError(absl::StrCat(what, " ", path, " does not exist"));
    }
    return Annotate(confined.status(), what);
  }
  location.path = *std::move(confined);
  return location;
}

absl::Status PathPolicy::CheckInside(const kvstore::Location& confined, const std::string& path,
                                     absl::string_view what, bool allow_root_itself) const {
  std::vector<std::string> same_driver;
  for (const kvstore::Location& root : locations_) {
    if (root.driver != confined.driver) continue;
    same_driver.push_back(root.path);
    if (confined.path == root.path ? allow_root_itself : IsAtOrBelow(confined.path, root.path)) {
      return absl::OkStatus();
    }
  }
  const absl::string_view scheme = confined.driver->scheme();
  return absl::PermissionDeniedError(absl::StrCat(
      what, " ", path, confined.path == path ? "" : absl::StrCat(" resolves to ", confined.path, ","),
      " is not ", allow_root_itself ? "in" : "strictly inside", " an allowed ",
      scheme.empty() ? "local" : absl::StrCat(scheme, "://"), " root (",
      same_driver.empty() ? "none" : absl::StrJoin(same_driver, ", "), ")"));
}

absl::StatusOr<std::string> PathPolicy::CheckInput(const std::string& path) const {
  ASSIGN_OR_RETURN(kvstore::Location input, CheckedInput(path));
  return std::move(input.path);
}

absl::StatusOr<kvstore::Location> PathPolicy::CheckedInput(const std::string& path) const {
  ASSIGN_OR_RETURN(kvstore::Location input, Confine(path, "input", /*must_exist=*/true));
  RETURN_IF_ERROR(CheckInside(input, path, "input", /*allow_root_itself=*/true));
  // Only a store with folders of its own holds special files. Stat only: a FIFO or device is
  // never opened, so it cannot block the caller.
  if (input.driver->has_folders()) {
    absl::StatusOr<kvstore::PathStat> stat = input.driver->Stat(input.path);
    if (stat.ok() && !stat->special.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", path, " is ", stat->special, "; reshard reads regular files and folders"));
    }
  }
  return input;
}

absl::StatusOr<std::string> PathPolicy::CheckInputTree(const std::string& path) const {
  ASSIGN_OR_RETURN(const kvstore::Location input, CheckedInput(path));
  const std::string& resolved = input.path;
  // Only a store with folders of its own (posix) holds symlinks and special files; keys have
  // neither.
  if (!input.driver->has_folders()) return resolved;
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(resolved, error)) return resolved;
  int entries = 0;
  for (auto it = fs::recursive_directory_iterator(resolved, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (++entries > kMaxTreeEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", path, " holds more than ", kMaxTreeEntries, " entries"));
    }
    const std::string entry = it->path().string();
    struct stat st;
    if (::lstat(entry.c_str(), &st) != 0) continue;  // gone since listed
    if (S_ISLNK(st.st_mode)) {
      absl::StatusOr<std::string> target =
          input.driver->ConfinedPath(entry, /*must_exist=*/true);
      if (!target.ok() ||
          !CheckInside(kvstore::Location{input.driver, *target}, entry, "input", true).ok()) {
        return absl::PermissionDeniedError(
            absl::StrCat("input ", path, " holds ", entry, ", a symlink ",
                         target.ok() ? absl::StrCat("to ", *target, ", outside the allowed roots")
                                     : "that cannot be resolved"));
      }
      if (::stat(entry.c_str(), &st) != 0) continue;
    }
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", path, " holds ", entry, ", ", DescribeFileType(st.st_mode),
                       "; reshard reads regular files and folders only"));
    }
  }
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing input ", path));
  return resolved;
}

absl::StatusOr<std::string> PathPolicy::CheckOutput(const std::string& path) const {
  ASSIGN_OR_RETURN(const kvstore::Location output,
                   Confine(path, "output", /*must_exist=*/false));
  RETURN_IF_ERROR(CheckInside(output, path, "output", /*allow_root_itself=*/false));
  return output.path;
}

}  // namespace reshard
