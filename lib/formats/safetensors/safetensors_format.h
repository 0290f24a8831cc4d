// The safetensors format: single files and Hugging Face sharded folders.
//
// Reading (`SafetensorsInput`, id "safetensors"):
//   - a `.safetensors` file: one model;
//   - a folder with `model.safetensors.index.json`: one sharded model; the index is checked
//     against the files (every listed tensor is in its file, every file tensor is listed);
//   - a folder of `.safetensors` files without an index: one model when their tensor names are
//     disjoint, N model-parallel parts (natural file-name order) when all hold the same names.
// Each of these may be on any storage (s3://bucket/prefix, mem://; lib/io/kvstore).
// Writing (`SafetensorsOutput`): header first (compact JSON, `__metadata__` with
// `format: pt`, padded with spaces to 8 bytes), tensors ordered by dtype descending then name
// as the reference writer does; `model.safetensors` or `model-0000i-of-0000N.safetensors` plus
// `model.safetensors.index.json`; parts are `model_part-{rank}.safetensors`.

#ifndef RESHARD_LIB_FORMATS_SAFETENSORS_SAFETENSORS_FORMAT_H_
#define RESHARD_LIB_FORMATS_SAFETENSORS_SAFETENSORS_FORMAT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "lib/formats/format.h"
#include "lib/formats/safetensors/header.h"

namespace reshard {

inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";
// The `__metadata__` key under which a single-file output carries the input's nesting
// (StructureToJson, lib/core/catalog.h), restored when reshard reads the file back.
inline constexpr char kStructureMetadataKey[] = "reshard.structure";

class SafetensorsInput : public InputFormat {
 public:
  static constexpr char kId[] = "safetensors";
  absl::string_view id() const override { return kId; }
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Generic (a file or folder of .safetensors files), asked before torch.
  int probe_priority() const override { return 10; }
  // Files and folders on object stores too (s3://): metadata through small range reads.
  // Also restores tied aliases recorded in `__metadata__` ("lm_head.weight":
  // "model.embed_tokens.weight") as names of the stored data.
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;

 private:
  absl::StatusOr<InputModel> ReadWithoutAliases(const std::string& path) const;
};

class SafetensorsOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "safetensors";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override;
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;
};

// Adds the tensors of one validated file to `catalog` as a new source file, of `version` when
// remote (SourceFile::version, as ReadSafetensorsHeader gave it).
void AddSafetensorsFileToCatalog(const std::string& path, uint64_t file_size,
                                 const std::string& version, const SafetensorsHeader& header,
                                 Catalog& catalog);

// Serializes a header for `tensors` (already in file order) with `metadata`; returns the
// 8-byte length prefix + JSON + padding. ResourceExhausted past the 100 MB header limit.
absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensorEntry>& tensors,
    const std::map<std::string, std::string>& metadata);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_SAFETENSORS_SAFETENSORS_FORMAT_H_
