// Which paths the daemon may read and write: only under its --allowed-root folders.
//
// Paths are parsed once into a kvstore::Location, and checked against the roots of the same
// driver only, in the spelling that driver confines by (kvstore::Driver::ConfinedPath): posix
// paths resolved with realpath(3); object-store prefixes such as "s3://bucket" or
// "s3://bucket/prefix" validated (no "." or ".." or empty segments), never resolved, since a
// key has no symlinks. A path lies in a root when it is the root or continues it by whole
// segments ("s3://b/team-a" does not hold "s3://b/team-ab"). Whether an object-store input
// exists is found when the job reads it. A scheme no driver here serves is refused.
//
// Posix paths must be absolute; resolving them refuses ".." components and symlinks that lead
// outside a root (PERMISSION_DENIED). An output folder that does not exist yet is resolved
// through its deepest existing ancestor; the components below it must be plain names. Outputs
// must lie strictly inside a root, because the staging folder is a sibling. Inputs that are
// FIFOs, sockets or devices (or folders holding one) are refused.
//
// These checks are made at submit; what a job then opens goes through `confinement()`
// (lib/io/file_access.h), which re-checks every open of a posix path against the posix roots.

#ifndef RESHARD_SERVER_PATH_POLICY_H_
#define RESHARD_SERVER_PATH_POLICY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"

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

  // Every root in its driver's confined spelling: local ones resolved, s3:// ones normalized
  // ("s3://bucket/prefix").
  const std::vector<std::string>& roots() const { return roots_; }
  // The same roots as a PathConfinement: jobs and Inspect/Plan calls run under it, so that
  // what they open after these checks stays beneath the roots even if paths change meanwhile.
  const PathConfinement* confinement() const { return confinement_.get(); }

 private:
  // `path` parsed, checked for syntax and in the spelling its driver confines by.
  absl::StatusOr<kvstore::Location> Confine(const std::string& path, absl::string_view what,
                                            bool must_exist) const;
  // CheckInput's Location.
  absl::StatusOr<kvstore::Location> CheckedInput(const std::string& path) const;
  // OK when `confined` (of `path`, `what` in messages) is a root of its driver or lies below
  // one (the root itself only with `allow_root_itself`); PermissionDenied naming the roots of
  // that driver otherwise.
  absl::Status CheckInside(const kvstore::Location& confined, const std::string& path,
                           absl::string_view what, bool allow_root_itself) const;

  std::vector<kvstore::Location> locations_;  // the roots, confined, without trailing slash
  std::vector<std::string> roots_;            // their paths
  std::shared_ptr<const PathConfinement> confinement_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_PATH_POLICY_H_
