// PyTorch checkpoints written by torch.save (the zip format, torch >= 1.6).
//
// Reading (`TorchInput`, id "torch"): the zip container is parsed without trusting its sizes,
// `data.pkl` runs through the safe pickle reader, and every tensor becomes a Catalog piece
// located in place: the storage record's payload offset plus the tensor's storage offset, with
// its real strides (non-contiguous views are valid input). Storages are never loaded. Nested
// state dicts ({"model": {...}, "optimizer": {...}}) give dotted tensor names; entries that are
// not tensors are listed in Catalog::other_entries. Tensors that view the same storage the
// same way (tied weights) appear once per name. A folder of torch files is read like a folder of
// safetensors files (index `pytorch_model.bin.index.json`, shards, or model-parallel parts).
// The pre-1.6 (legacy pickle) format is recognized and refused with an explanation.
//
// Remote inputs (s3://): a file, a folder of them or an indexed folder is read like a local
// one, its metadata by a few range reads per file (TorchArchive over a RangeReadSource; a
// folder's files several at a time) and its storages by the executor's range reads. A remote
// folder holding files of layouts other formats read (DeepSpeed's `latest` or
// `*_model_states.pt`, DCP's `.metadata`, Megatron's tracker, ColossalAI's metadata) is not
// claimed: those formats do not read remote paths yet, and their .pt files are no model.

#ifndef RESHARD_LIB_FORMATS_TORCH_TORCH_FORMAT_H_
#define RESHARD_LIB_FORMATS_TORCH_TORCH_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/plan/partition_rules.h"

namespace reshard {

inline constexpr char kTorchIndexName[] = "pytorch_model.bin.index.json";

class TorchInput : public InputFormat {
 public:
  static constexpr char kId[] = "torch";
  absl::string_view id() const override { return kId; }
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Generic: asked after every format that recognizes a specific arrangement of files.
  int probe_priority() const override { return 0; }
  // The model, described as "torch.save, ..." (metaseq's model-parallel parts named so).
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

// The `metaseq` rule preset (registered as "metaseq" for --rules): OPT / metaseq
// model-parallel parts ("<name>-model_part-<rank>.pt"), as metaseq/scripts/reshard_mp.py
// classifies their tensors, first match wins; unlike that script, a tensor matching nothing is
// an error rather than silently dropped.
std::vector<PartitionRule> MetaseqPresetRules();

// The Catalog of one torch.save file whose bytes are `data` (the whole file), found at `path`.
absl::StatusOr<Catalog> ReadTorchFile(absl::string_view data, const std::string& path);

// The Catalog of an archive already parsed: every tensor under its dotted key path, as source
// file 0 (the archive's path and size).
absl::StatusOr<Catalog> CatalogFromArchive(const TorchArchive& archive);

// The same for the part of the archive's pickle tree below `value` (a state dict inside a
// checkpoint), its tensors named by their dotted key path below `prefix` (may be empty).
absl::StatusOr<Catalog> CatalogFromValue(const TorchArchive& archive, const PickleValue* value,
                                         const std::string& prefix);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_TORCH_FORMAT_H_
