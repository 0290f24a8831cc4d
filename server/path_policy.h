// Which paths the daemon may read and write: only under its --allowed-root folders.
//
// Paths are resolved with realpath(3) before the check, so ".." components and symlinks that
// lead outside a root are refused (PERMISSION_DENIED). An output folder that does not exist yet
// is resolved through its deepest existing ancestor; the components below it must be plain
// names. Outputs must lie strictly inside a root, because the staging folder is a sibling.

#ifndef RESHARD_SERVER_PATH_POLICY_H_
#define RESHARD_SERVER_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

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

  const std::vector<std::string>& roots() const { return roots_; }

 private:
  bool Inside(const std::string& resolved, bool allow_root_itself) const;

  std::vector<std::string> roots_;  // resolved, without trailing slash
};

}  // namespace reshard

#endif  // RESHARD_SERVER_PATH_POLICY_H_
