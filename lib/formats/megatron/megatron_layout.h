// The layout of Megatron-LM and Megatron-DeepSpeed checkpoints without IO: file and folder
// names, the merge of a TP rank's pipeline stages into one Catalog, and the partition rules of
// a Megatron GPT (the `megatron` preset and its SwiGLU / attention-head variants). The readers
// (megatron_lm_reader, deepspeed_pipe_reader) and MegatronInput (megatron_format.h) build on it;
// megatron_format.h describes the layouts.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_LAYOUT_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_LAYOUT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/plan/partition_rules.h"

namespace reshard {

// The format id of MegatronInput, and of the Catalogs its readers make.
inline constexpr char kMegatronFormatId[] = "megatron";
// The file of one Megatron-LM rank folder (mp_rank_XX[_YYY]/model_optim_rng.pt).
inline constexpr char kMegatronRankFileName[] = "model_optim_rng.pt";
// InputModel::training_state key of a mixture-of-experts input's expert naming (kBool: true for
// TEGroupedMLP's `linear_fc1.weight<l>`, false for SequentialMLP's `local_experts.<l>.*`).
inline constexpr char kMegatronGroupedExpertsKey[] = "megatron.grouped_experts";
// InputModel::training_state key of a Megatron-DeepSpeed input whose merged tensors include
// fused sub-params (universal_checkpoint_info.parameter_with_sub_params: the GQA
// query_key_value each TP rank saves as [q_t; k_t; v_t]), which both pipeline readers regroup
// so that the merged tensor is ds_to_universal's: its sub-params one after the other along the
// partition dimension ([q; k; v]), not Megatron-LM's per-group interleave [ng, r + 2, d, h].
// A dict: tensor name (the catalog's) -> {"partition_dim": int, "sizes": [int, ...]}. Outputs
// that split or re-fuse a QKV tensor read it (RecordedSubParams).
inline constexpr char kMegatronSubParamsKey[] = "megatron.sub_params";
// The last pipeline stage's copy of the tied word embeddings, left out of merged stages.
inline constexpr char kMegatronHeadCopyName[] = "word_embeddings_for_head.weight";
// Ranks and layer indices above this are not real checkpoints; the bound keeps loops small.
inline constexpr int kMaxMegatronIndex = 1 << 20;

// How a merged tensor recorded under kMegatronSubParamsKey holds its sub-params.
struct SubParamLayout {
  int partition_dim = 0;
  std::vector<int64_t> sizes;  // along partition_dim, in order: (q rows, k rows, v rows)
};

// Records in `values` (a TrainingState's) that tensor `name` holds `layout`.
void RecordSubParams(std::map<std::string, StructureNode>& values, const std::string& name,
                     const SubParamLayout& layout);

// What `values` records for tensor `name`; nullopt when it records nothing (the tensor is laid
// out as Megatron-LM lays it out).
std::optional<SubParamLayout> RecordedSubParams(const std::map<std::string, StructureNode>& values,
                                                absl::string_view name);

// UnimplementedError when `values` records a tensor merged from sub-params, naming it and the
// file of `catalog` holding its first piece: `output` ("--format megatron") writes the fused QKV
// in Megatron-LM's per-group layout, which would need the [q; k; v] rows interleaved again.
absl::Status RefuseSubParams(const std::map<std::string, StructureNode>& values,
                             const Catalog& catalog, absl::string_view output);

// `catalog` (the merged model a reshard splits into `parts` by `rules`) with every tensor that
// `values` records as merged from sub-params ([q; k; v]) and that `rules` split along the
// sub-params' dimension viewed part by part (ViewSubTensorsByPart, lib/plan/layout_builders.h):
// each part then holds its slice of every sub-param, [q_t; k_t; v_t], as a Megatron-DeepSpeed
// TP rank saves it, not a slice of [q; k; v]. InvalidArgument naming the tensor when `parts`
// does not divide a sub-param.
absl::Status ViewSubParamsByPart(const std::map<std::string, StructureNode>& values,
                                 const PartitionRules& rules, int parts, Catalog& catalog);

// A run of digits as an index in [0, kMaxMegatronIndex); nullopt for anything else.
std::optional<int> ParseMegatronIndex(absl::string_view text);

// "mp_rank_03_model_states.pt" -> 3 (DeepSpeed's per model-parallel-rank file).
std::optional<int> ParseModelStatesFile(absl::string_view name);

// A Megatron-LM rank folder name: "mp_rank_01" (PP = 1) or "mp_rank_01_002".
struct MegatronRankDir {
  int tp = 0;
  int pp = 0;
  bool has_pp = false;  // the name carries the PP rank
  int ep = -1;          // expert-parallel rank ("mp_rank_00_000_001"), -1 when absent
};
std::optional<MegatronRankDir> ParseMegatronRankDir(absl::string_view name);
// "mp_rank_01" or "mp_rank_01_002", as Megatron's get_checkpoint_name spells them; with
// `ep` >= 0 the expert-parallel rank follows: "mp_rank_01_003" (PP = 1), "mp_rank_01_002_003".
std::string MegatronRankDirName(int tp, int pp, bool has_pp, int ep = -1);

// The ranks a parsed rank folder name stands for in a save of the given sizes. Megatron's
// get_checkpoint_name appends _PPP when PP > 1 and then _EEE when EP > 1, so with PP = 1 and
// EP > 1 "mp_rank_00_001" is EP rank 1, not PP rank 1. The result has `ep` = 0 when EP = 1
// and `has_pp` as the name has it. "mp_rank_XX_000" (a PP rank spelled out with PP = 1) is
// accepted as other writers make it. nullopt: the name has more or fewer numbers than the sizes
// give it.
std::optional<MegatronRankDir> InterpretMegatronRankDir(const MegatronRankDir& parsed,
                                                        bool pipeline, bool expert);

// A tensor of one expert of a mixture-of-experts layer, as Megatron-Core names it: SequentialMLP
// "decoder.layers.3.mlp.experts.local_experts.2.linear_fc1.weight" and TEGroupedMLP
// "decoder.layers.3.mlp.experts.linear_fc1.weight2" both give experts =
// "decoder.layers.3.mlp.experts", local = 2, rest = "linear_fc1.weight". (`shared_experts.*`
// are dense, not experts.)
struct ExpertTensorName {
  std::string experts;
  int local = 0;
  std::string rest;
};
std::optional<ExpertTensorName> ParseExpertTensorName(absl::string_view name);
// The name of `expert`'s tensor in a consolidated model: "<experts>.local_experts.<expert>.<rest>",
// SequentialMLP's spelling with the global expert id.
std::string ExpertTensorNameFor(const ExpertTensorName& name, int64_t expert);
// The name of local expert `local`'s tensor in a rank's file, in SequentialMLP's spelling
// ("<experts>.local_experts.<local>.<rest>") or, `grouped`, TEGroupedMLP's
// ("<experts>.linear_fc1.weight<local>"): the inverse of ParseExpertTensorName.
std::string LocalExpertTensorName(const ExpertTensorName& name, int64_t local, bool grouped);
// The global id of local expert `local` of EP rank `ep_rank`, each rank holding `local_experts`
// (Megatron-Core's local_expert_indices: ep_rank * local_experts + local).
inline int64_t GlobalExpertId(int ep_rank, int64_t local_experts, int64_t local) {
  return static_cast<int64_t>(ep_rank) * local_experts + local;
}

// The experts each of `expert_parts` expert-parallel ranks holds (--expert-parts; 0 is 1) when
// the model's mixture-of-experts layers hold `experts` each, counted as `counted` says
// ("experts (args.num_experts)"); 0 for a model without experts and no --expert-parts.
// InvalidArgument naming --expert-parts when it does not divide the experts, or when the model
// has none to distribute.
absl::StatusOr<int64_t> LocalExpertsPerRank(int expert_parts, int64_t experts,
                                            absl::string_view counted);

// A DeepSpeed pipeline layer file name: "layer_03-model_01-model_states.pt".
struct PipeLayerFile {
  int layer = 0;
  int tp = 0;
};
std::optional<PipeLayerFile> ParsePipeLayerFile(absl::string_view name);
// "layer_03-model_01-model_states.pt", as DeepSpeed's PipelineModule.ckpt_layer_path spells it.
std::string PipeLayerFileName(int layer, int tp);

// The iteration folder a Megatron tracker file's text names: "100" -> "iter_0000100",
// "release" -> "release"; nullopt for anything else. Whitespace around it is ignored.
std::optional<std::string> IterationFolderFromTracker(absl::string_view text);

// What latest_checkpointed_iteration.txt says for the iteration folder of the output file
// `file_name` ("iter_0000100/..." -> "100", "release/..." -> "release"), as Megatron writes it;
// InternalError naming any other folder.
absl::StatusOr<std::string> TrackerTextFor(absl::string_view file_name);

// One pipeline stage of one TP rank: its tensors with stage-local layer numbers.
struct PipelineStage {
  std::string name;  // "mp_rank_00_001", for messages
  Catalog catalog;
};

struct StageMergeOptions {
  // Layers every stage must hold in the main stack (`*.encoder.layers`,
  // `*.transformer.layers`, Megatron-Core's `decoder.layers`); unchecked when unset.
  std::optional<int64_t> layers_per_stage;
  // Layers all stages must hold together in the main stack; unchecked when unset.
  std::optional<int64_t> total_layers;
};

// Merges the stages of one TP rank (in pipeline order) into one Catalog: every `layers.N.`
// (under each distinct prefix) is renumbered by the layers of that prefix in earlier stages;
// each stage must hold local layers 0..n-1. `word_embeddings_for_head.weight` is left out and
// noted in other_entries. InvalidArgument naming the stage on a gap in the layer numbers, a
// count differing from the options, or a name found in two stages.
absl::StatusOr<Catalog> MergePipelineStages(std::vector<PipelineStage> stages,
                                            const StageMergeOptions& options);

// Whether the model's MLP is SwiGLU, judged from shapes: the first layer's
// mlp.dense_h_to_4h.weight (Megatron-Core: mlp.linear_fc1.weight, or in a mixture-of-experts
// layer an expert's or the shared experts' linear_fc1.weight) has twice as many rows as its
// dense_4h_to_h.weight (linear_fc2.weight) has columns. nullopt when the catalog has no such
// pair.
std::optional<bool> SwiGLUFromShapes(const Catalog& catalog);

// Megatron-DeepSpeed's pipeline names (`<layer spec index>.<key>`, as its layer files and
// ds_to_universal name them) -> the names Megatron-LM's GPTModel gives the same tensors: the
// layer holding word_embeddings is the embedding, the layers holding input_layernorm are the
// transformer layers in order, a later one holding only weight / bias the final norm, and
// `lm_head.weight` the untied output layer. An empty map when the names are not such;
// InvalidArgument naming a tensor that has no Megatron-LM counterpart.
absl::StatusOr<std::map<std::string, std::string>> PipeNamesToMegatronLM(
    const std::vector<std::string>& names);

// The `megatron` rule preset (registered as "megatron" for --rules): Megatron-LM GPT tensor
// parallelism, checkpoint version >= 2, GeLU MLP; Megatron-LM names and Megatron-DeepSpeed
// pipeline names such as `3.mlp.dense_4h_to_h` and `8.weight`; no catch-all.
std::vector<PartitionRule> MegatronPresetRules();

// The partition rules of a Megatron GPT: the `megatron` preset, with dense_h_to_4h as
// 2 fused blocks (gate, up) in front when `swiglu`, and query_key_value kept in whole units of
// `qkv_unit_rows` rows (one attention head's q, k, v; or one GQA head group) when above 1, so
// that a split into a tensor-parallel degree that does not divide the heads is refused.
std::vector<PartitionRule> MegatronPartitionRules(bool swiglu, int64_t qkv_unit_rows = 1);

// Rows of query_key_value that belong to one attention head (with grouped-query attention: one
// head group, its query heads plus one key and one value head), which a tensor-parallel split
// must keep together, from the args `arg` looks up (an int, or a bool as 0 / 1; nullopt when
// absent); 1 when the args do not say.
int64_t QkvUnitRowsOfArgs(
    const std::function<std::optional<int64_t>(absl::string_view key)>& arg);

// Sets, in the attributes of an args Namespace (`attributes`, may be null), the sizes of a run
// of `tp` x `pp` ranks with its layers balanced evenly over the stages:
// tensor_model_parallel_size and pipeline_model_parallel_size; the virtual stages and uneven
// stage sizes to None, the embedding and loss pipeline-split flags to False. Only keys the args
// have are set.
void SetMegatronParallelArgs(StructureNode* attributes, int tp, int pp);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_LAYOUT_H_
