// How a folder of checkpoint files becomes one model or N model-parallel parts, for any format
// whose files each hold whole tensors (safetensors, torch.save):
//   - with an index (Hugging Face `*.index.json`: weight_map tensor -> file), the files are
//     shards of one model and must agree with the index exactly;
//   - without one, files whose tensor names are disjoint are shards of one model, and files that
//     all hold the same names are model-parallel parts, in natural file-name order.

#ifndef RESHARD_LIB_FORMATS_FOLDER_MODEL_H_
#define RESHARD_LIB_FORMATS_FOLDER_MODEL_H_

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
// natural order.
std::vector<std::string> ListFolder(const std::string& dir,
                                    const std::vector<std::string>& suffixes);

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
