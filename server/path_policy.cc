#include "server/path_policy.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"
#include "lib/io/directory.h"
#include "lib/io/file_access.h"
#include "lib/io/s3/s3_location.h"

namespace reshard {
namespace {

constexpr size_t kMaxPathLength = 4096;

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return ErrnoToStatus(errno, absl::StrCat("resolving ", path));
  }
  return std::string(resolved);
}

absl::Status CheckSyntax(const std::string& path, absl::string_view what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " path is empty"));
  RETURN_IF_ERROR(CheckLocalPath(path, std::string(what)));
  if (path.size() > kMaxPathLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " path is longer than ", kMaxPathLength));
  }
  if (path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " path \"", path, "\" is not absolute; the daemon needs absolute paths"));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " path contains a NUL byte"));
  }
  return absl::OkStatus();
}

// "s3://bucket/prefix" without a trailing '/', validated.
absl::StatusOr<std::string> NormalizeS3Url(const std::string& url, absl::string_view what) {
  if (url.size() > kMaxPathLength) {
    return absl::InvalidArgumentError(absl::StrCat(what, " URL is longer than ", kMaxPathLength));
  }
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url), what);
  while (!location.key.empty() && location.key.back() == '/') location.key.pop_back();
  return location.key.empty() ? absl::StrCat("s3://", location.bucket) : location.ToString();
}

}  // namespace

absl::StatusOr<std::string> PathPolicy::CheckS3(const std::string& url, absl::string_view what,
                                                bool allow_root_itself) const {
  ASSIGN_OR_RETURN(const std::string normalized, NormalizeS3Url(url, what));
  for (const std::string& root : s3_roots_) {
    if (normalized == root ? allow_root_itself : absl::StartsWith(normalized, root + "/")) {
      return normalized;
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat(what, " ", url, " is not ", allow_root_itself ? "in" : "strictly inside",
                   " an allowed s3:// root (",
                   s3_roots_.empty() ? "none" : absl::StrJoin(s3_roots_, ", "), ")"));
}

absl::StatusOr<PathPolicy> PathPolicy::Create(const std::vector<std::string>& roots) {
  if (roots.empty()) {
    return absl::InvalidArgumentError("at least one --allowed-root is required");
  }
  PathPolicy policy;
  std::vector<std::string> local_roots;
  for (const std::string& root : roots) {
    if (IsS3Url(root)) {
      ASSIGN_OR_RETURN(std::string normalized, NormalizeS3Url(root, "allowed root"));
      policy.s3_roots_.push_back(normalized);
      policy.roots_.push_back(std::move(normalized));
      continue;
    }
    RETURN_IF_ERROR(CheckLocalPath(root, "allowed root"));
    ASSIGN_OR_RETURN(const std::string resolved, RealPath(root), "allowed root");
    struct stat st;
    if (::stat(resolved.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("allowed root ", root, " is not a folder"));
    }
    std::string normalized = resolved;
    while (normalized.size() > 1 && normalized.back() == '/') normalized.pop_back();
    policy.roots_.push_back(normalized);
    local_roots.push_back(normalized);
  }
  // With s3:// roots only, the confinement has no roots: every local open is refused.
  ASSIGN_OR_RETURN(policy.confinement_, PathConfinement::Create(local_roots));
  return policy;
}

bool PathPolicy::Inside(const std::string& resolved, bool allow_root_itself) const {
  for (const std::string& root : roots_) {
    if (IsS3Url(root)) continue;
    if (resolved == root) {
      if (allow_root_itself) return true;
      continue;
    }
    const std::string prefix = root == "/" ? "/" : root + "/";
    if (resolved.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

absl::StatusOr<std::string> PathPolicy::CheckInput(const std::string& path) const {
  if (IsS3Url(path)) return CheckS3(path, "input", /*allow_root_itself=*/true);
  RETURN_IF_ERROR(CheckSyntax(path, "input"));
  auto resolved = RealPath(path);
  if (!resolved.ok()) {
    if (absl::IsNotFound(resolved.status())) {
      return absl::NotFoundError(absl::StrCat("input ", path, " does not exist"));
    }
    return resolved.status();
  }
  if (!Inside(*resolved, /*allow_root_itself=*/true)) {
    return absl::PermissionDeniedError(absl::StrCat("input ", path, " resolves to ", *resolved,
                                                    ", outside the allowed roots (",
                                                    absl::StrJoin(roots_, ", "), ")"));
  }
  // stat only: a FIFO or device is never opened, so it cannot block the caller.
  struct stat st;
  if (::stat(resolved->c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("input ", path, " is ",
                                                   DescribeFileType(st.st_mode),
                                                   "; reshard reads regular files and folders"));
  }
  return *resolved;
}

absl::StatusOr<std::string> PathPolicy::CheckInputTree(const std::string& path) const {
  ASSIGN_OR_RETURN(std::string resolved, CheckInput(path));
  if (IsS3Url(resolved)) return resolved;  // keys have no symlinks, FIFOs or devices
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
      auto target = RealPath(entry);
      if (!target.ok() || !Inside(*target, /*allow_root_itself=*/true)) {
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
  if (IsS3Url(path)) return CheckS3(path, "output", /*allow_root_itself=*/false);
  RETURN_IF_ERROR(CheckSyntax(path, "output"));
  // Split into the deepest existing ancestor and the plain names below it.
  std::vector<std::string> missing;
  std::string existing = path;
  while (existing.size() > 1 && existing.back() == '/') existing.pop_back();
  struct stat st;
  while (::lstat(existing.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoToStatus(errno, absl::StrCat("checking output ", path));
    const size_t slash = existing.rfind('/');
    std::string name = existing.substr(slash + 1);
    if (name == "." || name == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("output ", path, " uses \"", name, "\" below an existing folder"));
    }
    if (!name.empty()) missing.insert(missing.begin(), name);
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
  auto real_existing = RealPath(existing);
  if (!real_existing.ok()) {
    // lstat found it, realpath cannot follow it: a dangling symlink, wherever it points.
    return absl::PermissionDeniedError(absl::StrCat(
        "output ", path, ": ", existing, " is a symlink that cannot be resolved (",
        real_existing.status().message(), "); outputs must lie inside the allowed roots"));
  }
  std::string resolved = *std::move(real_existing);
  for (const std::string& name : missing) {
    resolved = resolved == "/" ? "/" + name : resolved + "/" + name;
  }
  if (!Inside(resolved, /*allow_root_itself=*/false)) {
    return absl::PermissionDeniedError(absl::StrCat("output ", path, " resolves to ", resolved,
                                                    ", which is not inside the allowed roots (",
                                                    absl::StrJoin(roots_, ", "), ")"));
  }
  return resolved;
}

}  // namespace reshard
