// How a folder of checkpoint files becomes one model or N model-parallel parts, for any format
// whose files each hold whole tensors (safetensors, torch.save):
//   - with an index (Hugging Face `*.index.json`: weight_map tensor -> file), the files are
//     shards of one model and must agree with the index exactly;
//   - without one, files whose tensor names are disjoint are shards of one model, and files that
//     all hold the same names are model-parallel parts, in natural file-name order.

#ifndef RESHARD_LIB_FORMATS_FOLDER_MODEL_H_
#define RESHARD_LIB_FORMATS_FOLDER_MODEL_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"

namespace reshard {

// One file of the folder, already read into a Catalog of its own.
struct FileCatalog {
  std::string name;  // file name inside the folder
  Catalog catalog;
};

// "a2" < "a10": digit runs compare as numbers, so shards and parts sort in rank order.
bool NaturalLess(const std::string& a, const std::string& b);

// Regular files in `dir` whose names end with one of `suffixes`, hidden ones excluded, in
// natural order. Errors (the folder cannot be listed) name `dir`.
absl::StatusOr<std::vector<std::string>> ListFolder(const std::string& dir,
                                                    const std::vector<std::string>& suffixes);

// Whether `path` is a folder holding a file that ListFolder(path, suffixes) lists and `matches`
// accepts: the Probe of formats recognized by one file's name (ColossalAI's metadata files,
// verl's rank files). False for a file; errors as CheckInputFolder and ListFolder.
absl::StatusOr<bool> FolderHoldsFileNamed(const std::string& path,
                                          const std::vector<std::string>& suffixes,
                                          const std::function<bool(const std::string&)>& matches);

// The InputModel of one model read from folder `dir` whose tensors are spread over several
// files (arrangement "sharded"): `catalog` (reindexed here) as its one part, described by
// `description`, to which ", N replicated copies read once" is added when the reader kept N
// copies of boxes for `verify` (CatalogTensor::replicas).
InputModel ShardedFolderModel(const std::string& format, const std::string& dir, Catalog catalog,
                              std::string description, int64_t replicated_copies);

// Reads file `name` of folder `dir` (the Catalog of that one file).
using ReadFolderFile =
    std::function<absl::StatusOr<FileCatalog>(const std::string& dir, const std::string& name)>;

// Files of a remote folder read at once by ReadFolderFiles.
inline constexpr int kRemoteFileReads = 8;

// Files `names` of folder `dir`, each read with `read_one`, in that order. A remote folder's
// files are read up to kRemoteFileReads at a time (each costs a few requests); a local
// folder's one by one, on this thread, which holds the path confinement they are opened
// under. The first failure in file order is returned.
absl::StatusOr<std::vector<FileCatalog>> ReadFolderFiles(const std::string& dir,
                                                         const std::vector<std::string>& names,
                                                         const ReadFolderFile& read_one);

// One model from folder `dir` with the Hugging Face index `index_path` in it: the files its
// weight_map names (natural order), each read with `read_one` (ReadFolderFiles) and checked
// against the weight map (AssembleIndexedFolder). A file the index names that does not exist is
// NotFound naming the file, the index and a tensor it maps there.
absl::StatusOr<InputModel> ReadIndexedFolder(absl::string_view format, const std::string& dir,
                                             const std::string& index_path,
                                             const ReadFolderFile& read_one);

// The weight_map of a Hugging Face index file, in file order: (tensor, file name). File names
// must be plain names in the index's folder. DataLoss naming the index otherwise.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadWeightMap(
    const std::string& index_path);

// One model from the files of an indexed folder; checks the files against the weight map.
absl::StatusOr<InputModel> AssembleIndexedFolder(
    absl::string_view format, const std::string& dir, const std::string& index_path,
    const std::vector<std::pair<std::string, std::string>>& weight_map,
    std::vector<FileCatalog> files);

// One model (disjoint names) or model-parallel parts (identical names) from a folder's files.
absl::StatusOr<InputModel> AssembleFolder(absl::string_view format, const std::string& dir,
                                          std::vector<FileCatalog> files);

// The Hugging Face index of a consolidated layout of several files, as transformers writes it
// (sorted keys, indent 2, trailing newline): weight_map of the stored tensors, and metadata
// with total_size (data bytes) and the tied aliases (alias -> stored name).
std::string HuggingFaceIndexJson(const TargetLayout& layout);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FOLDER_MODEL_H_
