// Writes a Hugging Face transformers model (`HfOutput`, id "hf") from a Megatron checkpoint:
//
//   reshardctl consolidate IN OUT --format hf [--family F] [--config FILE] [--vocab-size N]
//                                             [--tokenizer DIR] [--dtype D] [--max-shard-size S]
//
//   OUT/model.safetensors  or  model-0000i-of-0000N.safetensors + model.safetensors.index.json
//   OUT/config.json, OUT/generation_config.json                               (hf_config.h)
//   OUT/tokenizer.json, ...: the tokenizer beside the checkpoint (its save folder or a tokenizer/
//   subfolder; a NeMo input's own: a .nemo's tokenizer members, a NeMo 2 folder's
//   context/nemo_tokenizer/; --tokenizer DIR instead; none with --no-extra-files), carried by
//   PlanConversion (model_files.h); config.json's bos/eos token ids come from it when it gives
//   them unambiguously (HfSpecialTokenIds; whole files only, not an archive's members), else
//   are left out
//
// IN is a Megatron-LM / Megatron-DeepSpeed TP x PP checkpoint (merged by the megatron reader:
// TP shards joined, stage-local layer numbers made global; Megatron-DeepSpeed pipeline layer
// names read as the Megatron-LM names of the same tensors, PipeNamesToMegatronLM in
// lib/formats/megatron/megatron_layout.h) or a Megatron-Core torch_dist one
// (layers unstacked by its reader). Every tensor is renamed to the family's HF name
// (hf_family.h) and written as a region of the input tensor or of a view of it, so nothing is
// materialised and memory stays bounded by the copy window:
//   - fused QKV [ng * (r + 2) * d, h] (ng query groups, r = heads / ng, d = head_dim), viewed as
//     [ng, r + 2, d, h]: q_proj = [:, :r], k_proj = [:, r], v_proj = [:, r + 1], each written
//     flattened ([nh * d, h], [ng * d, h]); its bias (qwen2) likewise;
//   - gated fc1: the merged tensor is [gate; up] (the megatron reader joins each TP shard's
//     [gate_t; up_t] halves, torch_dist saves it so), viewed as [2, ffn, h];
//   - mixtral: the router mlp.router.weight [E, h] is block_sparse_moe.gate.weight; expert g's
//     fc1 (global id g, as the megatron reader merges expert-parallel ranks) is split as the gated
//     fc1 above into block_sparse_moe.experts.<g>.w1.weight (gate) and w3.weight (up), its fc2
//     is w2.weight;
//   - word embeddings and an untied output layer: the first vocab_size rows (config.json's
//     vocab_size) of the padded vocabulary; tied embeddings: no lm_head.weight;
//   - TransformerEngine `_extra_state`: not written.
// The files are sharded and framed as the safetensors output does (Hugging Face's rule).
//
// A training save of a model already under Hugging Face names (deepspeed-zero, torch-dcp input:
// HF Trainer + DeepSpeed or FSDP) is written with its own names instead, wrapper prefix
// stripped, with the config.json and tokenizer found beside it (hf_named.h; PresentInput checks
// it, ArrangeHfNamed lays it out).
//
// Refused before anything is written, naming what: input that is neither Megatron nor such a
// save; reshard (the
// output is one model); an unknown family; a tensor with no HF counterpart (shared experts and
// router biases among them); a QKV bias or q/k norms the family lacks (or lacks them when the
// family has them); experts with a dense family, a dense MLP layer with mixtral, an expert
// missing or beyond num_local_experts; config.json keys the args
// lack without --config; a tensor whose shape disagrees with config.json (both shapes named);
// heads not divisible by groups; a vocabulary larger than the rows.

#ifndef RESHARD_LIB_FORMATS_HF_HF_OUTPUT_H_
#define RESHARD_LIB_FORMATS_HF_HF_OUTPUT_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/formats/format.h"
#include "lib/formats/safetensors/safetensors_format.h"

namespace reshard {

class HfOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "hf";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override { return safetensors_.naming(); }
  absl::StatusOr<ArrangedOutput> Arrange(TargetLayout engine_layout,
                                         const ArrangeRequest& request) const override;
  // A training save under Hugging Face names (deepspeed-zero, torch-dcp input): checked and
  // its wrapper prefix stripped (PresentHfNamedModel, hf_named.h). Other input: unchanged.
  absl::StatusOr<bool> PresentInput(const std::string& input, int parts, int pipeline_parts,
                                    const HfExportOptions& hf, InputModel& model,
                                    Catalog& catalog) const override;
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override {
    return safetensors_.Frame(file);
  }
  // The safetensors index when sharded, then config.json and generation_config.json.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;

 private:
  // Arrange for a model PresentInput presented: the engine's shards as they are, config.json
  // from --config (its torch_dtype set after a cast; else the carried one is), and
  // generation_config.json made from config.json unless one is carried.
  absl::StatusOr<ArrangedOutput> ArrangeHfNamed(TargetLayout engine_layout,
                                                const ArrangeRequest& request) const;

  SafetensorsOutput safetensors_;
};

// For `inspect` of a Megatron checkpoint whose merged model is `catalog`: model.description
// with the family `--family auto` picks and why ("...; --format hf --family auto: qwen2 (a QKV
// bias)"). For a Hugging Face model folder (IsSavePretrainedModel): the description naming it
// so ("Hugging Face model folder (torch.save files), one model in 3 shards"). The description
// unchanged for other input, an empty catalog, or when a tensor has no HF counterpart. Only
// inspect's: the manifest keeps the reader's description.
std::string WithHfFamilyNote(const InputModel& model, const Catalog& catalog);

// What `inspect` says of writing a checkpoint with `--format hf`.
struct HfExportNote {
  std::string family;  // the family `--format hf` writes it as; empty: it is refused
  // "exports to Hugging Face as llama (--format hf)", or "does not export to Hugging Face
  // [as llama, when the tensors decide the family] (--format hf) as it stands: " and the
  // export's refusal (a tensor no family has a place for, config.json keys the args lack and
  // --config or --vocab-size would give, ...).
  std::string note;
};

// For a Megatron checkpoint (megatron, megatron-torch-dist, nemo input) whose merged model is
// `catalog`: what `consolidate IN OUT --format hf` without --family, --config or --vocab-size
// does with it, planned as the export plans it (HfOutput::Arrange, reading no tensor data).
// For a training save under Hugging Face names (deepspeed-zero, torch-dcp input) read from
// `input`: whether its names and shapes pass ReadHfNamedModel with the config.json found beside
// it, and the family and config.json that decided ("exports to Hugging Face as llama (--format
// hf): Hugging Face llama model (config.json: ...)"). nullopt for other input.
std::optional<HfExportNote> DescribeHfExport(const InputModel& model, const Catalog& catalog,
                                             const std::string& input);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_HF_OUTPUT_H_
