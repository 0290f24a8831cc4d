// Which paths the daemon may read and write: only under its --allowed-root folders.
//
// Paths are resolved with realpath(3) before the check, so ".." components and symlinks that
// lead outside a root are refused (PERMISSION_DENIED). An output folder that does not exist yet
// is resolved through its deepest existing ancestor; the components below it must be plain
// names. Outputs must lie strictly inside a root, because the staging folder is a sibling.
// Inputs that are FIFOs, sockets or devices (or folders holding one) are refused.
//
// Roots may also be object-store prefixes, "s3://bucket" or "s3://bucket/prefix": an s3:// path
// is allowed when it is such a root or lies below it by whole key segments ("s3://b/team-a"
// does not hold "s3://b/team-ab"). URLs are validated (ParseS3Url: no "." or ".." or empty
// segments), never resolved: a key has no symlinks. Whether an input object exists is found when
// the job reads it. Other remote schemes are refused.
//
// These checks are made at submit; what a job then opens goes through `confinement()`
// (lib/io/file_access.h), which re-checks every open against the same roots.

#ifndef RESHARD_SERVER_PATH_POLICY_H_
#define RESHARD_SERVER_PATH_POLICY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/io/file_access.h"

namespace reshard {

class PathPolicy {
 public:
  // Resolves every root; NotFound/InvalidArgument when one is missing or not a folder.
  static absl::StatusOr<PathPolicy> Create(const std::vector<std::string>& roots);

  // The resolved path of an existing input under a root.
  absl::StatusOr<std::string> CheckInput(const std::string& path) const;
  // CheckInput, and when the input is a folder, every symlink below it (a checkpoint's shard
  // files, index, rank folders) must also resolve inside a root. At most kMaxTreeEntries
  // entries are examined; a larger tree is refused.
  absl::StatusOr<std::string> CheckInputTree(const std::string& path) const;

  static constexpr int kMaxTreeEntries = 100000;
  // The resolved path of an output folder (existing or not) strictly inside a root.
  absl::StatusOr<std::string> CheckOutput(const std::string& path) const;

  // Every root, local ones resolved, s3:// ones normalized ("s3://bucket/prefix").
  const std::vector<std::string>& roots() const { return roots_; }
  // The same roots as a PathConfinement: jobs and Inspect/Plan calls run under it, so that
  // what they open after these checks stays beneath the roots even if paths change meanwhile.
  const PathConfinement* confinement() const { return confinement_.get(); }

 private:
  bool Inside(const std::string& resolved, bool allow_root_itself) const;
  // The normalized `url` when it lies in an s3:// root (or is one, with allow_root_itself).
  absl::StatusOr<std::string> CheckS3(const std::string& url, absl::string_view what,
                                      bool allow_root_itself) const;

  std::vector<std::string> roots_;     // all, local ones resolved, without trailing slash
  std::vector<std::string> s3_roots_;  // the s3:// ones, normalized, without trailing slash
  std::shared_ptr<const PathConfinement> confinement_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_PATH_POLICY_H_
