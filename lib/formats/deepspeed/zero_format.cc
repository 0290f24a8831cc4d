#include "lib/formats/deepspeed/zero_format.h"

#include <string>
#include <utility>

#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/moe_zero_reader.h"
#include "lib/formats/deepspeed/no_zero_reader.h"
#include "lib/formats/deepspeed/zero_folder_files.h"
#include "lib/formats/deepspeed/zero_reader.h"
#include "lib/formats/deepspeed/zero_save_folder.h"
#include "lib/io/file_access.h"

namespace reshard {

using zero_internal::FolderScan;
using zero_internal::ListZeroFolder;
using zero_internal::ReadMoeZeroCheckpoint;
using zero_internal::ReadWithoutOptimizerFiles;
using zero_internal::ReadZeroCheckpoint;
using zero_internal::ResolveCheckpointFolder;
using zero_internal::ScanFolder;
using zero_internal::SubFolders;
using zero_internal::ZeroFolderFiles;

absl::StatusOr<bool> ZeroInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return false;
  ASSIGN_OR_RETURN(const FolderScan here, ScanFolder(path));
  if (here.pipeline) return false;
  if (here.Checkpoint()) return true;
  // A parent folder: `latest` or --tag picks the checkpoint at Read.
  ASSIGN_OR_RETURN(const std::vector<std::string> folders, SubFolders(path));
  for (const std::string& name : folders) {
    ASSIGN_OR_RETURN(const FolderScan scan, ScanFolder(JoinPath(path, name)));
    if (scan.Checkpoint()) return true;
  }
  return false;
}

absl::StatusOr<InputModel> ZeroInput::Read(const std::string& path,
                                           const ReadOptions& options) const {
  ASSIGN_OR_RETURN(auto folder_tag, ResolveCheckpointFolder(path, options.tag));
  auto& [folder, tag] = folder_tag;
  ASSIGN_OR_RETURN(ZeroFolderFiles files, ListZeroFolder(folder));
  if (!files.any_optimizer_file) return ReadWithoutOptimizerFiles(folder, tag, files, options);
  if (!files.moe_files.empty()) return ReadMoeZeroCheckpoint(folder, tag, files, options);
  return ReadZeroCheckpoint(std::move(folder), std::move(tag), std::move(files), options);
}

namespace {
const InputFormatRegistration<ZeroInput> register_input;
}  // namespace

}  // namespace reshard
