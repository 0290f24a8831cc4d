// NeMo checkpoints (id "nemo"): NeMo 1 `.nemo` archives and NeMo 2 folders, read in place as
// the Megatron models they hold.
//
// NeMo 1 (`MegatronGPTModel.save_to`): a tar archive (members usually prefixed "./"; see
// tar_archive.h) holding
//   model_config.yaml       the model's config (OmegaConf YAML): tensor_model_parallel_size,
//                           pipeline_model_parallel_size, num_layers, ...
//   <md5>_<name>            tokenizer files (tokenizer.model, vocab.json, merges.txt), named by
//                           NeMo's register_artifact with a 32-hex-digit hash prefix
// and the weights in one of three layouts:
//   model_weights.ckpt                           TP = PP = 1: torch.save of the state dict
//   mp_rank_XX/model_weights.ckpt                PP = 1: one per TP rank
//   tp_rank_XX_pp_rank_YYY/model_weights.ckpt    PP > 1: one per (TP, PP) rank
//   model_weights/ (metadata.json, ...)          a distributed checkpoint (torch_dist or zarr),
//                                                its tensors under `model.` names
// Each model_weights.ckpt is a state dict under Megatron-Core names (`model.decoder.layers.0.
// self_attention.linear_qkv.weight`) or legacy Megatron-LM ones (`model.language_model.encoder.
// layers.0...`), kept as they are (the `model.` prefix included; `--format hf` strips it). The
// archive is never unpacked: each ckpt member is parsed as a torch.save archive through a slice
// of the archive's bytes, and its tensors are pieces of the archive file at the member's data
// offset, so a local, in-memory or S3 archive is converted alike. Per-rank layouts are read as
// Megatron's are: the pipeline stages of a TP rank merged (layers renumbered, megatron_layout.h),
// the TP ranks given as model-parallel parts with partition rules for both name sets
// (NemoPartitionRules). The TP x PP size comes from model_config.yaml; every rank's member must
// be there ("NeMo 1 TP2 x PP1: member mp_rank_01/model_weights.ckpt is missing") and no other.
// A `model_weights/` torch_dist checkpoint is read in place by the torch_dist reader, unchanged,
// through the archive mounted as a read-only folder (tar_store.h: "tar://<archive>!/
// model_weights"); its catalog is then placed onto the archive file (each piece at its member's
// data offset), so the conversion reads the archive itself. TP x PP and --format hf's config
// come from model_config.yaml. A metadata naming a member the archive lacks fails naming the
// archive and member. A Zarr-backend one (metadata.json's sharded_backend "zarr") is refused
// (Unimplemented): no description of that layout is precise enough to test a reader against.
//
// model_config.yaml's `tokenizer` entries `model`, `vocab_file` and `merge_file` that name
// members ("nemo:<hash>_<name>") are the model's tokenizer (InputModel::model_files, each the
// member's byte range of the archive), under the Hugging Face names `--format hf` writes them as:
// tokenizer.model; tokenizer.json, vocab.json or vocab.txt; merges.txt. An entry naming a
// member outside the archive's root ("nemo:../x") is InvalidArgument, one the archive lacks
// DataLoss, both naming the archive, the entry and the member. Unless the config has
// vocab_size, the first of them that gives a vocabulary size (a SentencePiece model's pieces,
// a vocab.json's entries) is args.vocab_size: the rows past it are Megatron's padding.
//
// NeMo 2 (`nemo.lightning` checkpoints): a folder with
//   context/   io.json, model.yaml, nemo_tokenizer/ (the tokenizer files)
//   weights/   a Megatron-Core torch_dist checkpoint (torch_dist_format.h), tensors named
//              `module.decoder.layers.<i>...` (the `module.` prefix kept)
// read through the torch_dist reader. The model's config (args for --format hf) is
// context/model.yaml's `config` mapping when it parses, else context/io.json's (fiddle's
// serialization of the TrainerContext, nemo_io_json.h). A malformed io.json (TrainingState's
// args_problem, naming it and the JSON path) refuses `--format hf` alone: the weights are read
// as from any folder. context/nemo_tokenizer/'s tokenizer.model or vocab.json gives
// args.vocab_size as above.
//
// `inspect` names the layout: "NeMo 1 archive, TP2 x PP1, model_weights.ckpt per rank, 2 layers;
// tokenizer files: tokenizer.model", "NeMo 1 archive, torch_dist weights (model_weights/), TP2 x
// PP1, 2 layers; ...; Megatron-Core torch_dist, model_weights, ..." or "NeMo 2 folder (context/,
// weights/): Megatron-Core torch_dist ...".

#ifndef RESHARD_LIB_FORMATS_NEMO_NEMO_FORMAT_H_
#define RESHARD_LIB_FORMATS_NEMO_NEMO_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"
#include "lib/plan/partition_rules.h"

namespace reshard {

class NemoInput : public InputFormat {
 public:
  static constexpr char kId[] = "nemo";
  absl::string_view id() const override { return kId; }
  // A tar archive (the ustar magic in its first header), or a folder holding context/ and
  // weights/ folders.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Above every other format: an archive is a single file that no other format claims, and a
  // NeMo 2 folder's weights/ is a torch_dist folder (45).
  int probe_priority() const override { return 50; }
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

// The partition rules of a NeMo GPT's per-rank weights: Megatron-Core names (linear_qkv,
// linear_proj, linear_fc1, linear_fc2, their fused layer norms, Transformer Engine's
// `_extra_state` replicated) in front of the `megatron`
// preset (legacy names). `swiglu`: linear_fc1 / dense_h_to_4h hold [gate; up] (2 fused blocks);
// `qkv_unit_rows` > 1: QKV rows stay whole in units of one head group.
std::vector<PartitionRule> NemoPartitionRules(bool swiglu, int64_t qkv_unit_rows);

// A tokenizer file's name without NeMo's register_artifact hash prefix:
// "0123456789abcdef0123456789abcdef_tokenizer.model" -> "tokenizer.model"; others unchanged.
std::string StripArtifactHash(absl::string_view name);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_NEMO_NEMO_FORMAT_H_
