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

class StagingDir {
 public:
  // Checks the output folder, creates its missing parents, clears a stale staging folder and
  // creates and locks a fresh one.
  static absl::StatusOr<StagingDir> Create(const std::string& output_dir);

  StagingDir() = default;
  StagingDir(StagingDir&& other) noexcept;
  StagingDir& operator=(StagingDir&& other) noexcept;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  // Removes the staging folder unless it was published.
  ~StagingDir();

  const std::string& path() const { return path_; }
  const std::string& output_dir() const { return output_dir_; }

  // Makes the staged folder the output folder, durably.
  absl::Status Publish();

 private:
  void Abandon();

  std::string output_dir_;
  std::string path_;
  int lock_fd_ = -1;
  bool published_ = false;
};

// The staging folder name used for `output_dir`.
std::string StagingPathFor(const std::string& output_dir);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_STAGING_DIR_H_
