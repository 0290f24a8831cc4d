// Stages a whole output folder and publishes it in one rename.
//
// A conversion writes into `<parent>/.<name>.reshard-staging`, a sibling of the requested
// output folder, and `Publish` renames the staging folder onto the output (which must not exist
// or be empty; rename(2) replaces an empty folder atomically). A process killed at any point
// leaves nothing under the output's name. The staging folder is locked with flock while in use;
// an unlocked one left by a killed run is stale: the next run removes it, or takes it over with
// StagingOptions::resume (RunConversion does, to reuse its recorded files).
//
// Everything after `Create` goes through folder handles (lib/io/directory.h): the output's
// parent is opened once, and creating, renaming and removing the staging folder happen
// relative to it, so a parent swapped for a symlink while a job runs can neither redirect a
// write nor make a cleanup delete outside. `Publish` refuses (PermissionDenied) when the
// parent's path no longer names the folder the staging folder was made in.

#ifndef RESHARD_LIB_IO_STAGING_DIR_H_
#define RESHARD_LIB_IO_STAGING_DIR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/io/directory.h"

namespace reshard {

// FailedPrecondition unless `output_dir` does not exist or is an empty folder.
absl::Status CheckOutputDirUsable(const std::string& output_dir);

struct StagingOptions {
  // Keep the files of a stale staging folder (a killed earlier run) so that finished output
  // files can be reused; `.partial` files are always removed.
  bool resume = false;
  // Allow a non-empty output folder; Publish replaces it. Default: refused.
  bool overwrite = false;
};

class StagingDir {
 public:
  // Checks the output folder, creates its missing parents, clears (or, resuming, keeps) a
  // stale staging folder and creates and locks the staging folder. Under a PathConfinement
  // (lib/io/file_access.h) the parent is opened beneath the allowed roots.
  static absl::StatusOr<StagingDir> Create(const std::string& output_dir,
                                           const StagingOptions& options = {});

  StagingDir() = default;
  StagingDir(StagingDir&& other) noexcept;
  StagingDir& operator=(StagingDir&& other) noexcept;
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  // Removes the staging folder unless it was published.
  ~StagingDir();

  // The staging folder's path, for messages.
  std::string path() const { return parent_.PathOf(staging_name_); }
  const std::string& output_dir() const { return output_dir_; }
  // The output folder's parent and the output's name in it: formats that update a tracker
  // file beside the output (DeepSpeed's `latest_universal`) write it through this handle.
  const Directory& parent() const { return parent_; }
  const std::string& output_name() const { return output_name_; }
  // The staging folder: write the output's files through this handle.
  const Directory& dir() const { return dir_; }

  // Leaves the staging folder in place (unlocked) for a later resume instead of removing it.
  void Keep();

  // Makes the staged folder the output folder, durably. With `overwrite`, a non-empty output
  // folder is first moved aside and removed after the rename.
  absl::Status Publish();

 private:
  void Abandon();
  // PermissionDenied unless the parent's path still names the folder `parent_` holds.
  absl::Status CheckParentInPlace() const;

  std::string output_dir_;
  std::string parent_path_;
  std::string output_name_;
  std::string staging_name_;
  Directory parent_;
  Directory dir_;  // the staging folder, flocked while this run owns it
  bool published_ = false;
  bool overwrite_ = false;
};

// The staging folder name used for `output_dir`.
std::string StagingPathFor(const std::string& output_dir);

// `path` lexically normalized ("a/./b/" -> "a/b"), without trailing slashes.
std::string NormalizeOutputPath(const std::string& path);

// An output folder split into its parent ("." when none) and its name (the last component,
// which may be empty or "..": callers check it with CheckPlainName).
struct OutputLocation {
  std::string parent;
  std::string name;
};
OutputLocation SplitOutputPath(const std::string& output_dir);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_STAGING_DIR_H_
