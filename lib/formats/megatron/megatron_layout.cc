#include "lib/formats/megatron/megatron_layout.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "lib/plan/layout_builders.h"

namespace reshard {
namespace {

// "language_model.encoder.layers.3.mlp.x" -> ("language_model.encoder.layers", 3, "mlp.x").
struct LayerName {
  std::string prefix;
  int64_t index = 0;
  std::string rest;
};

std::optional<LayerName> SplitLayerName(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] != "layers") continue;
    const std::optional<int> index = ParseMegatronIndex(parts[i + 1]);
    if (!index.has_value()) continue;
    LayerName result;
    result.prefix = absl::StrJoin(parts.begin(), parts.begin() + i + 1, ".");
    result.index = *index;
    result.rest = absl::StrJoin(parts.begin() + i + 2, parts.end(), ".");
    return result;
  }
  return std::nullopt;
}

bool IsMainStack(absl::string_view prefix) {
  return prefix == "layers" || absl::EndsWith(prefix, "encoder.layers") ||
         absl::EndsWith(prefix, "transformer.layers") || prefix == "decoder.layers";
}

}  // namespace

// A run of digits as an index in [0, kMaxMegatronIndex).
void RecordSubParams(std::map<std::string, StructureNode>& values, const std::string& name,
                     const SubParamLayout& layout) {
  StructureNode& record = values[kMegatronSubParamsKey];
  record.kind = StructureNode::Kind::kDict;
  StructureNode sizes;
  sizes.kind = StructureNode::Kind::kList;
  for (int64_t size : layout.sizes) sizes.items.push_back(StructureNode::Int(size));
  StructureNode entry = StructureNode::Dict();
  entry.Add(StructureNode::String("partition_dim"), StructureNode::Int(layout.partition_dim));
  entry.Add(StructureNode::String("sizes"), std::move(sizes));
  record.Add(StructureNode::String(name), std::move(entry));
}

std::optional<SubParamLayout> RecordedSubParams(const std::map<std::string, StructureNode>& values,
                                                absl::string_view name) {
  const auto found = values.find(kMegatronSubParamsKey);
  if (found == values.end()) return std::nullopt;
  const StructureNode* entry = found->second.Find(name);
  if (entry == nullptr) return std::nullopt;
  SubParamLayout layout;
  if (const StructureNode* dim = entry->Find("partition_dim");
      dim != nullptr && dim->kind == StructureNode::Kind::kInt) {
    layout.partition_dim = static_cast<int>(dim->integer);
  }
  if (const StructureNode* sizes = entry->Find("sizes")) {
    for (const StructureNode& size : sizes->items) layout.sizes.push_back(size.integer);
  }
  return layout;
}

absl::Status RefuseSubParams(const std::map<std::string, StructureNode>& values,
                             const Catalog& catalog, absl::string_view output) {
  const auto found = values.find(kMegatronSubParamsKey);
  if (found == values.end() || found->second.keys.empty()) return absl::OkStatus();
  const std::string& name = found->second.keys.front().text;
  std::string file;
  if (const int index = catalog.Find(name);
      index >= 0 && !catalog.tensors[index].pieces.empty()) {
    file = absl::StrCat(" (", catalog.files[catalog.tensors[index].pieces[0].file].path, ")");
  }
  return absl::UnimplementedError(absl::StrCat(
      "tensor \"", name, "\"", file,
      " is a Megatron-DeepSpeed fused QKV saved as sub-params ([q; k; v] per TP rank, "
      "universal_checkpoint_info.parameter_with_sub_params), not grouped per query group as "
      "Megatron-LM's query_key_value is; ",
      output, " does not write it (consolidate and --format hf read it)"));
}

absl::Status ViewSubParamsByPart(const std::map<std::string, StructureNode>& values,
                                 const PartitionRules& rules, int parts, Catalog& catalog) {
  for (CatalogTensor& tensor : catalog.tensors) {
    const std::optional<SubParamLayout> layout = RecordedSubParams(values, tensor.name);
    if (!layout.has_value()) continue;
    ASSIGN_OR_RETURN(const PartitionRule* rule, rules.Match(tensor.name));
    // Replicated, or split along another dimension: each part's slice holds whole sub-params
    // or none, as in [q; k; v]. Equal fused blocks (--rules `fused` 3) are already per part.
    if (rule->replicate || rule->fused > 1) continue;
    ASSIGN_OR_RETURN(const int dim, ResolveSplitDim(*rule, tensor.shape.size(), tensor.name));
    if (dim != layout->partition_dim) continue;
    ASSIGN_OR_RETURN(tensor, ViewSubTensorsByPart(tensor, dim, layout->sizes, parts),
                     "a Megatron-DeepSpeed fused QKV saved as sub-params "
                     "(universal_checkpoint_info.parameter_with_sub_params), split per part");
  }
  return absl::OkStatus();
}

std::optional<int> ParseMegatronIndex(absl::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value >= kMaxMegatronIndex) return std::nullopt;
  return value;
}

// "mp_rank_03_model_states.pt" -> 3 (DeepSpeed's per model-parallel-rank file).
std::optional<int> ParseModelStatesFile(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "mp_rank_") || !absl::ConsumeSuffix(&name, "_model_states.pt")) {
    return std::nullopt;
  }
  return ParseMegatronIndex(name);
}

std::string PipeLayerFileName(int layer, int tp) {
  return absl::StrFormat("layer_%02d-model_%02d-model_states.pt", layer, tp);
}

std::optional<MegatronRankDir> ParseMegatronRankDir(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "mp_rank_")) return std::nullopt;
  std::vector<absl::string_view> fields = absl::StrSplit(name, '_');
  if (fields.empty() || fields.size() > 3) return std::nullopt;
  std::vector<int> numbers;
  for (absl::string_view field : fields) {
    const std::optional<int> number = ParseMegatronIndex(field);
    if (!number.has_value()) return std::nullopt;
    numbers.push_back(*number);
  }
  MegatronRankDir rank;
  rank.tp = numbers[0];
  rank.has_pp = numbers.size() >= 2;
  rank.pp = rank.has_pp ? numbers[1] : 0;
  rank.ep = numbers.size() == 3 ? numbers[2] : -1;
  return rank;
}

std::string MegatronRankDirName(int tp, int pp, bool has_pp, int ep) {
  std::string name = has_pp ? absl::StrFormat("mp_rank_%02d_%03d", tp, pp)
                            : absl::StrFormat("mp_rank_%02d", tp);
  if (ep >= 0) absl::StrAppendFormat(&name, "_%03d", ep);
  return name;
}

std::optional<MegatronRankDir> InterpretMegatronRankDir(const MegatronRankDir& parsed,
                                                        bool pipeline, bool expert) {
  const int numbers = 1 + (parsed.has_pp ? 1 : 0) + (parsed.ep >= 0 ? 1 : 0);
  MegatronRankDir rank;
  rank.tp = parsed.tp;
  rank.ep = 0;
  if (expert) {
    if (numbers == 2 && !pipeline) {
      rank.ep = parsed.pp;  // mp_rank_TT_EEE
      return rank;
    }
    if (numbers != 3 || (!pipeline && parsed.pp != 0)) return std::nullopt;
    rank.has_pp = true;
    rank.pp = parsed.pp;
    rank.ep = parsed.ep;
    return rank;
  }
  if (numbers == 3 || (numbers == 1 && pipeline) || (numbers == 2 && !pipeline && parsed.pp != 0)) {
    return std::nullopt;
  }
  rank.has_pp = parsed.has_pp;
  rank.pp = parsed.pp;
  return rank;
}

std::optional<ExpertTensorName> ParseExpertTensorName(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  for (size_t i = 0; i + 2 < parts.size(); ++i) {
    if (parts[i] != "experts") continue;
    ExpertTensorName result;
    result.experts = absl::StrJoin(parts.begin(), parts.begin() + i + 1, ".");
    if (parts[i + 1] == "local_experts" && i + 3 < parts.size()) {
      const std::optional<int> local = ParseMegatronIndex(parts[i + 2]);
      if (!local.has_value()) return std::nullopt;
      result.local = *local;
      result.rest = absl::StrJoin(parts.begin() + i + 3, parts.end(), ".");
      return result;
    }
    // TEGroupedMLP: linear_fc1.weight<l>, linear_fc2.bias<l>.
    if (i + 3 != parts.size() || !absl::StartsWith(parts[i + 1], "linear_fc")) return std::nullopt;
    absl::string_view last = parts[i + 2];
    absl::string_view kind;
    for (absl::string_view prefix : {"weight", "bias"}) {
      if (absl::ConsumePrefix(&last, prefix)) {
        kind = prefix;
        break;
      }
    }
    const std::optional<int> local = ParseMegatronIndex(last);
    if (kind.empty() || !local.has_value()) return std::nullopt;
    result.local = *local;
    result.rest = absl::StrCat(parts[i + 1], ".", kind);
    return result;
  }
  return std::nullopt;
}

std::string ExpertTensorNameFor(const ExpertTensorName& name, int64_t expert) {
  return absl::StrCat(name.experts, ".local_experts.", expert, ".", name.rest);
}

std::string LocalExpertTensorName(const ExpertTensorName& name, int64_t local, bool grouped) {
  if (grouped) return absl::StrCat(name.experts, ".", name.rest, local);
  return ExpertTensorNameFor(name, local);
}

absl::StatusOr<int64_t> LocalExpertsPerRank(int expert_parts, int64_t experts,
                                            absl::string_view counted) {
  if (experts <= 0) {
    if (expert_parts <= 0) return 0;
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-parts ", expert_parts,
        ": the model has no mixture-of-experts layers (no tensor named "
        "*.mlp.experts.local_experts.<e>.* or *.mlp.experts.linear_fc1.weight<e>), so there "
        "are no experts to distribute"));
  }
  const int ep = std::max(expert_parts, 1);
  if (experts % ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--expert-parts ", ep, " does not divide the ", experts, " ", counted,
                     ": every expert-parallel rank holds the same number of experts"));
  }
  return experts / ep;
}

std::optional<PipeLayerFile> ParsePipeLayerFile(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "layer_") || !absl::ConsumeSuffix(&name, "-model_states.pt")) {
    return std::nullopt;
  }
  const size_t dash = name.find("-model_");
  if (dash == absl::string_view::npos) return std::nullopt;
  const std::optional<int> layer = ParseMegatronIndex(name.substr(0, dash));
  const std::optional<int> tp = ParseMegatronIndex(name.substr(dash + 7));
  if (!layer.has_value() || !tp.has_value()) return std::nullopt;
  return PipeLayerFile{*layer, *tp};
}

std::optional<std::string> IterationFolderFromTracker(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text == "release") return std::string("release");
  if (text.empty() || text.size() > 18) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int64_t iteration = 0;
  if (!absl::SimpleAtoi(text, &iteration)) return std::nullopt;
  return absl::StrFormat("iter_%07d", iteration);
}

absl::StatusOr<std::string> TrackerTextFor(absl::string_view file_name) {
  const absl::string_view folder = file_name.substr(0, file_name.find('/'));
  if (folder == "release") return std::string(folder);
  absl::string_view digits = folder;
  int64_t iteration = 0;
  if (!absl::ConsumePrefix(&digits, "iter_") || !absl::SimpleAtoi(digits, &iteration)) {
    return absl::InternalError(absl::StrCat("unexpected iteration folder ", folder));
  }
  return absl::StrCat(iteration);
}

absl::StatusOr<Catalog> MergePipelineStages(std::vector<PipelineStage> stages,
                                            const StageMergeOptions& options) {
  Catalog merged;
  merged.format = kMegatronFormatId;
  absl::flat_hash_map<std::string, int> file_index;        // path -> merged file
  absl::flat_hash_map<std::string, std::string> stage_of;  // merged name -> stage
  std::map<std::string, int64_t> offset;                   // layer prefix -> layers so far
  for (size_t s = 0; s < stages.size(); ++s) {
    PipelineStage& stage = stages[s];
    // This stage's layers per prefix: they must be 0..n-1.
    std::map<std::string, std::set<int64_t>> local;
    for (const CatalogTensor& tensor : stage.catalog.tensors) {
      if (auto layer = SplitLayerName(tensor.name); layer.has_value()) {
        local[layer->prefix].insert(layer->index);
      }
    }
    for (const auto& [prefix, indices] : local) {
      const int64_t count = static_cast<int64_t>(indices.size());
      if (*indices.rbegin() != count - 1) {
        std::vector<int64_t> shown(indices.begin(), indices.end());
        if (shown.size() > 12) shown.resize(12);
        return absl::InvalidArgumentError(
            absl::StrCat(stage.name, " holds ", prefix, " ", absl::StrJoin(shown, ", "),
                         indices.size() > 12 ? ", ..." : "",
                         "; a pipeline stage numbers its layers 0..n-1 (stage-local)"));
      }
    }
    if (options.layers_per_stage.has_value()) {
      for (const auto& [prefix, indices] : local) {
        if (IsMainStack(prefix) &&
            static_cast<int64_t>(indices.size()) != *options.layers_per_stage) {
          return absl::InvalidArgumentError(
              absl::StrCat(stage.name, " holds ", indices.size(), " layers (", prefix,
                           ".*), but the args give ", *options.layers_per_stage, " per stage"));
        }
      }
      bool has_main = false;
      for (const auto& [prefix, indices] : local) has_main |= IsMainStack(prefix);
      if (!has_main && *options.layers_per_stage > 0) {
        return absl::InvalidArgumentError(absl::StrCat(stage.name,
                                                       " holds no layers, but the args give ",
                                                       *options.layers_per_stage, " per stage"));
      }
    }
    // Files of this stage in the merged list (stages may share a file: virtual stages).
    std::vector<int> files;
    for (SourceFile& file : stage.catalog.files) {
      auto [it, inserted] = file_index.emplace(file.path, static_cast<int>(merged.files.size()));
      if (inserted) merged.files.push_back(file);
      files.push_back(it->second);
    }
    for (CatalogTensor& tensor : stage.catalog.tensors) {
      if (tensor.name == kMegatronHeadCopyName ||
          absl::EndsWith(tensor.name, absl::StrCat(".", kMegatronHeadCopyName))) {
        merged.other_entries.push_back(absl::StrCat(
            tensor.name, " (", stage.name,
            "): the last pipeline stage's copy of the tied word embeddings, left out (the "
            "first stage's word_embeddings.weight is the tensor)"));
        continue;
      }
      std::string name = tensor.name;
      if (auto layer = SplitLayerName(tensor.name); layer.has_value()) {
        name = absl::StrCat(layer->prefix, ".", offset[layer->prefix] + layer->index);
        if (!layer->rest.empty()) absl::StrAppend(&name, ".", layer->rest);
      }
      auto [it, inserted] = stage_of.emplace(name, stage.name);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", name, "\" is in both ", it->second, " and ", stage.name));
      }
      tensor.name = std::move(name);
      for (SourcePiece& piece : tensor.pieces) piece.file = files.at(piece.file);
      merged.tensors.push_back(std::move(tensor));
    }
    for (std::string& note : stage.catalog.other_entries) {
      merged.other_entries.push_back(std::move(note));
    }
    for (const auto& [prefix, indices] : local) {
      offset[prefix] += static_cast<int64_t>(indices.size());
    }
  }
  if (options.total_layers.has_value()) {
    for (const auto& [prefix, count] : offset) {
      if (IsMainStack(prefix) && count != *options.total_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("the ", stages.size(), " pipeline stages hold ", count, " layers (",
                         prefix, ".*), but args.num_layers is ", *options.total_layers));
      }
    }
  }
  merged.Reindex();
  return merged;
}

std::optional<bool> SwiGLUFromShapes(const Catalog& catalog) {
  // Megatron-LM's names, then Megatron-Core's: the dense MLP's, or in a mixture-of-experts
  // layer an expert's (`mlp.experts.local_experts.<e>.linear_fc1.weight`) or the shared
  // experts' (`mlp.shared_experts.linear_fc1.weight`), which are gated as the model is.
  constexpr std::pair<absl::string_view, absl::string_view> kPairs[] = {
      {"mlp.dense_h_to_4h.weight", "mlp.dense_4h_to_h.weight"},
      {".linear_fc1.weight", ".linear_fc2.weight"},
  };
  for (const auto& [up, down] : kPairs) {
    for (const CatalogTensor& tensor : catalog.tensors) {
      if (!absl::EndsWith(tensor.name, up)) continue;
      const int found = catalog.Find(
          absl::StrCat(tensor.name.substr(0, tensor.name.size() - up.size()), down));
      if (found < 0) continue;
      const Shape& up_shape = tensor.shape;
      const Shape& down_shape = catalog.tensors[found].shape;
      if (up_shape.size() != 2 || down_shape.size() != 2) continue;
      return up_shape[0] == 2 * down_shape[1];
    }
  }
  return std::nullopt;
}

std::vector<PartitionRule> MegatronPresetRules() {
  auto split = [](std::string pattern, int dim) {
    return PartitionRule{std::move(pattern), false, dim};
  };
  auto replicate = [](std::string pattern) { return PartitionRule{std::move(pattern), true}; };
  // Megatron-LM names (language_model.encoder.layers.N.*, older language_model.transformer.*
  // and attention.*) and DeepSpeed pipeline names (N.self_attention.*, N.weight for the final
  // norm); both ParallelAttention spellings are row-parallel in their dense projection.
  return {
      split("word_embeddings\\.weight", 0),
      split("query_key_value\\.(weight|bias)", 0),
      split("dense_h_to_4h\\.(weight|bias)", 0),
      split("(attention\\.dense|dense_4h_to_h)\\.weight", 1),
      replicate("(attention\\.dense|dense_4h_to_h)\\.bias|layernorm|position_embeddings"),
      split("(^|\\.)(output_layer|lm_head)\\.weight$", 0),
      replicate("_norm\\.(weight|bias)$|^\\d+\\.(weight|bias)$"),
      // Megatron-Core names in the same rank folders (GPTModel saved with --ckpt-format
      // torch), mixture-of-experts layers included: every expert and the shared experts are
      // TP-split as a dense MLP; the router is replicated.
      split("linear_qkv\\.(weight|bias)$", 0),
      split("linear_fc1\\.(weight|bias)$", 0),
      split("(linear_proj|linear_fc2)\\.weight$", 1),
      replicate("(linear_proj|linear_fc2)\\.bias$|layer_norm_(weight|bias)$"),
      replicate("mlp\\.router\\.(weight|bias|expert_bias)$"),
  };
}

std::vector<PartitionRule> MegatronPartitionRules(bool swiglu, int64_t qkv_unit_rows) {
  std::vector<PartitionRule> rules = MegatronPresetRules();
  if (swiglu) {
    rules.insert(rules.begin(),
                 PartitionRule{"(dense_h_to_4h|linear_fc1)\\.(weight|bias)$", false, 0, 2});
  }
  if (qkv_unit_rows > 1) {
    rules.insert(rules.begin(),
                 PartitionRule{"(query_key_value|linear_qkv)\\.(weight|bias)$", false, 0, 1,
                               qkv_unit_rows});
  }
  return rules;
}

int64_t QkvUnitRowsOfArgs(
    const std::function<std::optional<int64_t>(absl::string_view key)>& arg) {
  const std::optional<int64_t> heads = arg("num_attention_heads");
  if (!heads.has_value() || *heads <= 0 || *heads > kMaxMegatronIndex) return 1;
  std::optional<int64_t> head_dim = arg("kv_channels");
  if (!head_dim.has_value() || *head_dim <= 0) {
    const std::optional<int64_t> hidden = arg("hidden_size");
    if (!hidden.has_value() || *hidden <= 0 || *hidden % *heads != 0) return 1;
    head_dim = *hidden / *heads;
  }
  if (*head_dim > kMaxMegatronIndex) return 1;
  int64_t groups = *heads;
  if (arg("group_query_attention").value_or(0) != 0) {
    groups = arg("num_query_groups").value_or(*heads);
  } else if (auto kv = arg("num_key_value_heads"); kv.has_value() && *kv > 0) {
    groups = *kv;  // Megatron-DeepSpeed's name for the same thing
  }
  if (groups <= 0 || *heads % groups != 0) return 1;
  return (*heads / groups + 2) * *head_dim;
}

void SetMegatronParallelArgs(StructureNode* attributes, int tp, int pp) {
  auto set = [&](absl::string_view key, StructureNode value) {
    if (StructureNode* slot = FindKey(attributes, key); slot != nullptr) *slot = std::move(value);
  };
  set("tensor_model_parallel_size", StructureNode::Int(tp));
  set("pipeline_model_parallel_size", StructureNode::Int(pp));
  for (const char* key :
       {"virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
        "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"}) {
    set(key, StructureNode());
  }
  for (const char* key : {"standalone_embedding_stage", "account_for_embedding_in_pipeline_split",
                          "account_for_loss_in_pipeline_split"}) {
    set(key, StructureNode::Bool(false));
  }
}

absl::StatusOr<std::map<std::string, std::string>> PipeNamesToMegatronLM(
    const std::vector<std::string>& names) {
  std::map<std::string, std::string> renamed;
  std::map<int, std::vector<std::string>> keys;  // layer index -> keys
  for (const std::string& name : names) {
    const size_t dot = name.find('.');
    const std::optional<int> index =
        dot == std::string::npos ? std::nullopt : ParseMegatronIndex(name.substr(0, dot));
    if (!index.has_value()) {
      if (keys.empty()) return renamed;  // Megatron-LM names
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\" is not named `<layer index>.<key>` as the others are"));
    }
    keys[*index].push_back(name.substr(dot + 1));
  }
  std::optional<int> embedding;
  std::vector<int> layers;
  for (const auto& [index, list] : keys) {
    for (const std::string& key : list) {
      if (key == "word_embeddings.weight" && !embedding.has_value()) embedding = index;
      if (absl::StartsWith(key, "input_layernorm.") && (layers.empty() || layers.back() != index)) {
        layers.push_back(index);
      }
    }
  }
  for (const auto& [index, list] : keys) {
    const auto layer = std::find(layers.begin(), layers.end(), index);
    for (const std::string& key : list) {
      const std::string name = absl::StrCat(index, ".", key);
      std::string to;
      if (embedding.has_value() && index == *embedding) {
        to = absl::StrCat("language_model.embedding.", key);
      } else if (layer != layers.end()) {
        to = absl::StrCat("language_model.encoder.layers.", layer - layers.begin(), ".", key);
      } else if (key == "lm_head.weight") {
        to = "language_model.output_layer.weight";
      } else if (!layers.empty() && index > layers.back() && (key == "weight" || key == "bias")) {
        to = absl::StrCat("language_model.encoder.final_layernorm.", key);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", name,
            "\" of the Megatron-DeepSpeed pipeline checkpoint has no Megatron-LM counterpart "
            "(only the embedding, transformer layers, final norm and lm_head have one)"));
      }
      renamed.emplace(name, std::move(to));
    }
  }
  return renamed;
}

}  // namespace reshard
