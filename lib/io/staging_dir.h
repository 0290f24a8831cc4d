// Stages a whole output folder and publishes it in one rename.
//
// A conversion writes into `<parent>/.<name>.reshard-staging`, a sibling of the requested
// output folder, and `Publish` renames the staging folder onto the output (which must not exist
// or be empty; rename(2) replaces an empty folder atomically). A process killed at any point
// leaves nothing under the output's name. The staging folder is locked with flock while in use;
// an unlocked one left by a killed run is stale and is removed by the next run.

#ifndef RESHARD_LIB_IO_STAGING_DIR_H_
#define RESHARD_LIB_IO_STAGING_DIR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard {

// FailedPrecondition unless `output_dir` does not exist or is an empty folder.
absl::Status CheckOutputDirUsable(const std::string& output_dir);

struct StagingOptions {
  // Keep the files of a stale staging folder (a killed earlier attempt of the same job) so
  // that finished output files can be reused; `.partial` files are always removed.
  bool resume = false;
  // Allow a non-empty output folder; Publish replaces it. Default: refused.
  bool overwrite = false;
};

class StagingDir {
 public:
  // Checks the output folder, creates its missing parents, clears (or, resuming, keeps) a
  // stale staging folder and creates and locks the staging folder.
  static absl::StatusOr<StagingDir> Create(const std::string& output_dir,
                                           const StagingOptions& options = {});

  StagingDir() = default;
  StagingDir(StagingDir&& other) noexcept;
  StagingDir& operator=(StagingDir&& other) noexcept;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  // Removes the staging folder unless it was published.
  ~StagingDir();

  const std::string& path() const { return path_; }
  const std::string& output_dir() const { return output_dir_; }

  // Leaves the staging folder in place (unlocked) for a later resume instead of removing it.
  void Keep();

  // Makes the staged folder the output folder, durably. With `overwrite`, a non-empty output
  // folder is first moved aside and removed after the rename.
  absl::Status Publish();

 private:
  void Abandon();

  std::string output_dir_;
  std::string path_;
  int lock_fd_ = -1;
  bool published_ = false;
  bool overwrite_ = false;
};

// The staging folder name used for `output_dir`.
std::string StagingPathFor(const std::string& output_dir);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_STAGING_DIR_H_
