#include "lib/formats/megatron/megatron_output.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "lib/formats/hf/hf_import.h"
#include "lib/formats/megatron/megatron_core_names.h"
#include "lib/formats/megatron/megatron_layout.h"

namespace reshard {
namespace {

// The torch_dist reader's id (torch_dist_format.h), whose input PresentInput renames.
constexpr char kTorchDistId[] = "megatron-torch-dist";

using Kind = StructureNode::Kind;

constexpr char kTrackerName[] = "latest_checkpointed_iteration.txt";
constexpr char kWordEmbeddings[] = "language_model.embedding.word_embeddings.weight";
constexpr char kOutputLayer[] = "language_model.output_layer.weight";
// Megatron-Core's names of the same tensors.
constexpr char kCoreWordEmbeddings[] = "embedding.word_embeddings.weight";
constexpr char kCoreOutputLayer[] = "output_layer.weight";

bool IsWordEmbeddings(absl::string_view name) {
  return name == kWordEmbeddings || name == kCoreWordEmbeddings;
}
bool IsOutputLayer(absl::string_view name) {
  return name == kOutputLayer || name == kCoreOutputLayer;
}

// ---------------------------------------------------------------------------- args

// An int (or bool) attribute; nullopt when absent, None or another kind.
std::optional<int64_t> IntArg(const StructureNode* attributes, absl::string_view key) {
  return IntAttribute(attributes, key);
}

// Sets an attribute that is present (args of other Megatron versions may lack it).
void SetIfPresent(StructureNode* attributes, absl::string_view key, StructureNode value) {
  if (StructureNode* slot = FindKey(attributes, key); slot != nullptr) *slot = std::move(value);
}

// ---------------------------------------------------------------------------- names

// Where a tensor of the input goes.
struct Placement {
  enum class Part { kEmbedding, kLayer, kEncoderTail, kOutputLayer };
  Part part = Part::kEmbedding;
  // Megatron-Core names ("embedding.*", "decoder.*", "output_layer.*"), which its GPTModel
  // saves as one flat state dict in the same rank folders; else Megatron-LM's nested ones.
  bool core = false;
  std::string encoder_key;  // "encoder" or "transformer"; "decoder" for Megatron-Core names
  int64_t layer = -1;       // kLayer: the global layer index
  std::string rest;         // below the module: "word_embeddings.weight", "mlp.dense_4h_to_h.bias"
};

absl::StatusOr<Placement> Place(const std::string& name) {
  auto unknown = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", name,
        "\" is not part of a Megatron-LM GPT's embedding, encoder or output layer (nor of a "
        "Megatron-Core GPT's embedding, decoder or output layer), so the megatron output cannot "
        "place it"));
  };
  Placement placement;
  absl::string_view rest = name;
  placement.core = !absl::ConsumePrefix(&rest, "language_model.");
  if (absl::ConsumePrefix(&rest, "embedding.")) {
    placement.part = Placement::Part::kEmbedding;
  } else if (absl::ConsumePrefix(&rest, "output_layer.")) {
    placement.part = Placement::Part::kOutputLayer;
  } else {
    for (const char* key : placement.core ? std::vector<const char*>{"decoder"}
                                          : std::vector<const char*>{"encoder", "transformer"}) {
      if (absl::ConsumePrefix(&rest, absl::StrCat(key, "."))) placement.encoder_key = key;
    }
    if (placement.encoder_key.empty()) return unknown();
    placement.part = Placement::Part::kEncoderTail;
    absl::string_view layer = rest;
    if (absl::ConsumePrefix(&layer, "layers.")) {
      const size_t dot = layer.find('.');
      const std::optional<int> index =
          dot == absl::string_view::npos ? std::nullopt : ParseMegatronIndex(layer.substr(0, dot));
      if (!index.has_value()) return unknown();
      placement.part = Placement::Part::kLayer;
      placement.layer = *index;
      rest = layer.substr(dot + 1);
    }
  }
  if (rest.empty()) return unknown();
  placement.rest = std::string(rest);
  return placement;
}

// The prefix of a placed tensor's name in a rank's file: "language_model.encoder." or
// "decoder.", with the module for the embedding and output layer.
std::string FilePrefix(const Placement& where) {
  const std::string model = where.core ? "" : "language_model.";
  switch (where.part) {
    case Placement::Part::kEmbedding:
      return absl::StrCat(model, "embedding.");
    case Placement::Part::kOutputLayer:
      return absl::StrCat(model, "output_layer.");
    case Placement::Part::kLayer:
    case Placement::Part::kEncoderTail:
      break;
  }
  return absl::StrCat(model, where.encoder_key, ".");
}

// The module of an embedding tensor ("word_embeddings") and its key below ("weight").
std::pair<std::string, std::string> SplitModule(const std::string& rest) {
  const size_t dot = rest.find('.');
  if (dot == std::string::npos) return {rest, ""};
  return {rest.substr(0, dot), rest.substr(dot + 1)};
}

// ---------------------------------------------------------------------------- structure

// The child dict `key` of `dict`, made (ordered or not) on first use.
StructureNode& ChildDict(StructureNode& dict, const std::string& key, bool ordered) {
  for (size_t i = 0; i < dict.keys.size(); ++i) {
    if (dict.keys[i].text == key) return dict.values[i];
  }
  dict.keys.push_back(StructureNode::String(key));
  StructureNode child;
  child.kind = Kind::kDict;
  child.ordered = ordered;
  dict.values.push_back(std::move(child));
  return dict.values.back();
}

void AddTensor(StructureNode& dict, const std::string& key, const std::string& tensor) {
  dict.keys.push_back(StructureNode::String(key));
  StructureNode leaf;
  leaf.kind = Kind::kTensor;
  leaf.text = tensor;
  dict.values.push_back(std::move(leaf));
}

// What every file shares.
struct Plan {
  int tp = 1;
  int pp = 1;
  int ep = 1;                  // expert-parallel ranks: folders mp_rank_TT[_PPP]_EEE when > 1
  int64_t local_experts = 0;   // experts per EP rank (0: the model has no experts)
  bool grouped_experts = false;  // TEGroupedMLP names in the files
  int64_t layers_per_stage = 0;
  int64_t vocab_rows = -1;  // rows of word_embeddings (and output_layer) in all; -1: unchanged
  std::string folder;       // "iter_0000100" or "release"
  std::optional<StructureNode> args;
  std::optional<double> checkpoint_version;
  std::optional<int64_t> iteration;
  int64_t data_parallel = 1;
};

// The padded vocabulary for `tp`, as Megatron's _vocab_size_with_padding computes it, of the
// word embeddings `words` (named in messages) holding `rows_in` rows.
absl::StatusOr<int64_t> PaddedVocab(const StructureNode* args, absl::string_view words,
                                    int64_t rows_in, int tp) {
  const std::optional<int64_t> divisible = IntArg(args, "make_vocab_size_divisible_by");
  if (!divisible.has_value() || *divisible < 1) return rows_in;  // nothing to pad to: keep
  const int64_t multiple = *divisible * tp;
  const std::optional<int64_t> vocab = IntArg(args, "vocab_size");
  if (vocab.has_value() && *vocab > 0) {
    if (*vocab > rows_in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "args.vocab_size is ", *vocab, " but ", words, " has only ", rows_in, " rows"));
    }
    return (*vocab + multiple - 1) / multiple * multiple;
  }
  if (rows_in % multiple == 0) return rows_in;
  return absl::InvalidArgumentError(absl::StrCat(
      "the vocabulary must be padded again for TP ", tp, " (to a multiple of ",
      "args.make_vocab_size_divisible_by ", *divisible, " x ", tp, " = ", multiple,
      "), but the args do not record the original vocabulary size (args.vocab_size) and the ",
      rows_in, " padded rows of ", words, " are no such multiple"));
}

absl::Status CheckDivides(const StructureNode* args, absl::string_view key, int tp) {
  const std::optional<int64_t> value = IntArg(args, key);
  if (value.has_value() && *value > 0 && *value % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("args.", key, " is ", *value, ", which TP ", tp,
                     " does not divide: Megatron keeps whole attention heads (and query groups) "
                     "on every tensor-parallel rank"));
  }
  return absl::OkStatus();
}

// The args of the file of (t, p, e).
StructureNode FileArgs(const Plan& plan, int t, int p, int e) {
  StructureNode args = *plan.args;
  StructureNode* attributes = args.Attributes();
  // The layers are balanced evenly over PP stages, without virtual stages.
  SetMegatronParallelArgs(attributes, plan.tp, plan.pp);
  if (plan.local_experts > 0) {
    // Experts are split over TP as the dense MLP is (the partition rules), so the expert
    // tensor-parallel size is TP; num_experts is unchanged.
    SetIfPresent(attributes, "expert_model_parallel_size", StructureNode::Int(plan.ep));
    SetIfPresent(attributes, "expert_tensor_parallel_size", StructureNode::Int(plan.tp));
  }
  if (plan.vocab_rows > 0)
    SetIfPresent(attributes, "padded_vocab_size", StructureNode::Int(plan.vocab_rows));
  SetIfPresent(attributes, "world_size",
               StructureNode::Int(int64_t{plan.tp} * plan.pp * plan.data_parallel));
  // Megatron's default rank order (tp fastest, then dp, then pp), at data-parallel rank e:
  // expert-parallel ranks are the first EP data-parallel ranks.
  SetIfPresent(attributes, "rank",
               StructureNode::Int(t + int64_t{plan.tp} * e +
                                  int64_t{plan.tp} * plan.data_parallel * p));
  return args;
}

}  // namespace

OutputNaming MegatronOutput::naming() const {
  // The engine's parts before Arrange renames them.
  OutputNaming naming;
  naming.shard_file = [](int index, int) { return absl::StrCat("shard-", index); };
  naming.part_file = [](int rank, int) { return MegatronRankDirName(rank, 0, false); };
  return naming;
}

absl::StatusOr<ArrangedOutput> MegatronOutput::Arrange(TargetLayout engine_layout,
                                                       const ArrangeRequest& request) const {
  const InputModel& model = request.model;
  // Megatron input (a Megatron-Core torch_dist one under the names PresentInput gave it), or a
  // Hugging Face model PresentInput made a Megatron one.
  if (model.format != kMegatronFormatId && model.format != kTorchDistId &&
      model.training_state.Value(kHfImportFamilyKey) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the megatron output writes Megatron-LM checkpoints from Megatron input (Megatron-LM, "
        "Megatron-DeepSpeed or Megatron-Core torch_dist: its args, iteration and layers) or "
        "from a Hugging Face model (safetensors and config.json), not from ",
        model.format, " input"));
  }
  RETURN_IF_ERROR(RefuseSubParams(model.training_state.values, request.catalog,
                                  "--format megatron"));
  if (request.dtype != DTypePolicy::kKeep) {
    return absl::InvalidArgumentError(
        "--dtype with --format megatron: the args (params_dtype, fp16, bf16) would no longer "
        "describe the weights; write the checkpoint with --dtype keep");
  }
  const TrainingState& state = model.training_state;
  Plan plan;
  if (const StructureNode* saved = state.Value("megatron.args");
      saved != nullptr && saved->Attributes() != nullptr) {
    plan.args = *saved;
  }
  const StructureNode* args = plan.args.has_value() ? plan.args->Attributes() : nullptr;
  if (const StructureNode* iteration = state.Value("megatron.iteration");
      iteration != nullptr && iteration->kind == Kind::kInt) {
    plan.iteration = iteration->integer;
  }
  if (const StructureNode* version = state.Value("megatron.checkpoint_version")) {
    if (version->kind == Kind::kFloat) plan.checkpoint_version = version->real;
    if (version->kind == Kind::kInt) plan.checkpoint_version = version->integer;
  }
  // The tensors of each TP part, in the input's order.
  std::vector<std::vector<OutputTensor>> parts;
  if (request.consolidate) {
    parts.emplace_back();
    for (OutputFileLayout& file : engine_layout.files) {
      for (OutputTensor& tensor : file.tensors) {
        tensor.alias_of = -1;  // tied copies are distinct tensors of distinct modules here
        parts[0].push_back(std::move(tensor));
      }
    }
    std::stable_sort(
        parts[0].begin(), parts[0].end(),
        [](const OutputTensor& a, const OutputTensor& b) { return a.source < b.source; });
  } else {
    for (OutputFileLayout& file : engine_layout.files) parts.push_back(std::move(file.tensors));
  }
  plan.tp = static_cast<int>(parts.size());
  // Without --pipeline-parts one stage (as the CLI documents), not the input's; consolidating
  // writes TP 1 x PP 1.
  plan.pp = request.pipeline_parts > 0 && !request.consolidate ? request.pipeline_parts : 1;
  // Data-parallel ranks of the input, for world_size.
  const std::optional<int64_t> input_pp = IntArg(args, "pipeline_model_parallel_size");
  const std::optional<int64_t> input_tp = IntArg(args, "tensor_model_parallel_size");
  const std::optional<int64_t> world = IntArg(args, "world_size");
  if (auto dp = IntArg(args, "data_parallel_size"); dp.has_value() && *dp > 0) {
    plan.data_parallel = *dp;
  } else if (world.has_value() && input_tp.value_or(0) > 0 && input_pp.value_or(0) > 0 &&
             *world % (*input_tp * *input_pp) == 0) {
    plan.data_parallel = std::max<int64_t>(1, *world / (*input_tp * *input_pp));
  }
  RETURN_IF_ERROR(CheckDivides(args, "num_attention_heads", plan.tp));
  if (IntArg(args, "group_query_attention").value_or(0) != 0) {
    RETURN_IF_ERROR(CheckDivides(args, "num_query_groups", plan.tp));
  }
  RETURN_IF_ERROR(CheckDivides(args, "num_key_value_heads", plan.tp));

  // Megatron-DeepSpeed pipeline names, mapped to Megatron-LM's.
  std::vector<std::string> names;
  for (const OutputTensor& tensor : parts[0]) names.push_back(tensor.name);
  ASSIGN_OR_RETURN(const auto renamed, PipeNamesToMegatronLM(names));
  if (!renamed.empty()) {
    for (std::vector<OutputTensor>& part : parts) {
      for (OutputTensor& tensor : part) {
        auto it = renamed.find(tensor.name);
        if (it == renamed.end()) {
          return absl::InternalError(absl::StrCat("tensor \"", tensor.name, "\" is not in part 0"));
        }
        tensor.name = it->second;
      }
    }
  }

  // Where every tensor goes; the layers, and whether the embeddings are tied.
  std::vector<std::vector<Placement>> placements(parts.size());
  std::set<int64_t> layers;
  bool untied = false;
  for (size_t t = 0; t < parts.size(); ++t) {
    for (const OutputTensor& tensor : parts[t]) {
      ASSIGN_OR_RETURN(Placement placement, Place(tensor.name));
      if (placement.part == Placement::Part::kLayer) layers.insert(placement.layer);
      if (IsOutputLayer(tensor.name)) untied = true;
      placements[t].push_back(std::move(placement));
    }
  }
  // One naming throughout: Megatron-LM's nested modules or Megatron-Core's flat state dict.
  const bool core = !placements[0].empty() && placements[0][0].core;
  for (size_t i = 0; i < placements[0].size(); ++i) {
    if (placements[0][i].core != core) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", parts[0][i].name, "\" is named as ",
          placements[0][i].core ? "Megatron-Core" : "Megatron-LM", " names it but \"",
          parts[0][0].name, "\" as ", core ? "Megatron-Core" : "Megatron-LM",
          " does: the megatron output writes one model's names"));
    }
  }

  // The experts of mixture-of-experts layers, distributed over the expert-parallel ranks.
  std::map<std::string, std::set<int64_t>> experts_of;  // "decoder.layers.3.mlp.experts" -> ids
  for (size_t i = 0; i < parts[0].size(); ++i) {
    if (placements[0][i].part != Placement::Part::kLayer) continue;
    if (std::optional<ExpertTensorName> expert = ParseExpertTensorName(parts[0][i].name)) {
      experts_of[expert->experts].insert(expert->local);
    }
  }
  const int asked_ep = request.consolidate ? 0 : request.expert_parts;
  if (experts_of.empty()) {
    RETURN_IF_ERROR(LocalExpertsPerRank(asked_ep, 0, "experts").status());
  } else {
    plan.ep = std::max(asked_ep, 1);
    int64_t num_experts = static_cast<int64_t>(experts_of.begin()->second.size());
    std::string counted = absl::StrCat("experts of ", experts_of.begin()->first);
    if (const std::optional<int64_t> from_args = IntArg(args, "num_experts");
        from_args.has_value() && *from_args > 0) {
      num_experts = *from_args;
      counted = "experts (args.num_experts)";
    }
    for (const auto& [prefix, ids] : experts_of) {
      if (static_cast<int64_t>(ids.size()) != num_experts || *ids.rbegin() != num_experts - 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, " holds ", ids.size(), " experts (ids ", *ids.begin(), " to ",
            *ids.rbegin(), "), but the model has ", num_experts, " ", counted));
      }
    }
    ASSIGN_OR_RETURN(plan.local_experts, LocalExpertsPerRank(plan.ep, num_experts, counted));
    if (const StructureNode* grouped = state.Value(kMegatronGroupedExpertsKey);
        grouped != nullptr && grouped->kind == Kind::kBool) {
      plan.grouped_experts = grouped->boolean;
    } else {
      plan.grouped_experts = IntArg(args, "moe_grouped_gemm").value_or(0) != 0;
    }
    // Expert-parallel ranks are data-parallel ranks: the data-parallel size is a multiple of EP.
    plan.data_parallel = (plan.data_parallel + plan.ep - 1) / plan.ep * plan.ep;
    // At one pipeline stage the EP ranks' folders are mp_rank_TT_EEE, which readers tell from
    // pipeline stages (mp_rank_TT_PPP) by args.expert_model_parallel_size alone; the files
    // carry the input's args, so they must hold it.
    if (plan.ep > 1 && plan.pp == 1 && !IntArg(args, "expert_model_parallel_size").has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--expert-parts ", plan.ep, " with --format megatron at one pipeline stage writes "
          "mp_rank_TT_EEE folders, which only args.expert_model_parallel_size tells from "
          "pipeline stages, and the input's args ",
          args == nullptr ? "are missing (a torch_dist common.pt without args?)" : "lack it",
          ": the output could not be read back"));
    }
  }
  const StructureNode* release_value = state.Value("megatron.release");
  const bool release =
      release_value != nullptr && release_value->kind == Kind::kBool && release_value->boolean;
  if (release) {
    plan.folder = "release";
  } else if (plan.iteration.has_value() && *plan.iteration >= 0) {
    plan.folder = absl::StrFormat("iter_%07d", *plan.iteration);
  } else {
    return absl::InvalidArgumentError(
        "the input records no iteration (and is no release checkpoint), so the iteration folder "
        "of the output cannot be named");
  }

  const int64_t num_layers =
      IntArg(args, "num_layers").value_or(static_cast<int64_t>(layers.size()));
  if (static_cast<int64_t>(layers.size()) != num_layers ||
      (!layers.empty() && (*layers.begin() != 0 || *layers.rbegin() != num_layers - 1))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "args.num_layers is ", num_layers, " but the model holds ", layers.size(), " layers"));
  }
  if (num_layers % plan.pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-parts ", plan.pp, " does not divide the ", num_layers,
        " layers (args.num_layers) evenly; the megatron output balances layers evenly"));
  }
  plan.layers_per_stage = num_layers / plan.pp;

  // The vocabulary, padded again for the new TP.
  int64_t rows_in = -1;
  std::string words;
  for (const OutputTensor& tensor : parts[0]) {
    if (IsWordEmbeddings(tensor.name)) {
      rows_in = request.catalog.tensors[tensor.source].shape.at(0);
      words = tensor.name;
    }
  }
  if (rows_in > 0) {
    ASSIGN_OR_RETURN(plan.vocab_rows, PaddedVocab(args, words, rows_in, plan.tp));
    if (plan.vocab_rows % plan.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(words, ": ", plan.vocab_rows,
                                                     " rows do not divide into TP ", plan.tp));
    }
  }
  auto repad = [&](OutputTensor& tensor, int t) {
    if (plan.vocab_rows <= 0 || tensor.region.rank() == 0) return;
    const int64_t rows = plan.vocab_rows / plan.tp;
    tensor.region.origin[0] = rows * t;
    tensor.region.extent[0] = rows;
    tensor.zero_fill = rows * (t + 1) > request.catalog.tensors[tensor.source].shape[0];
    if (!tensor.written_shape.empty()) tensor.written_shape[0] = rows;
  };

  ArrangedOutput arranged;
  arranged.layout.kind = TargetLayout::Kind::kParts;
  for (int t = 0; t < plan.tp; ++t) {
    for (int p = 0; p < plan.pp; ++p) {
      for (int e = 0; e < plan.ep; ++e) {
        const bool first = p == 0;
        const bool last = p == plan.pp - 1;
        OutputFileLayout file;
        file.name = absl::StrCat(plan.folder, "/",
                                 MegatronRankDirName(t, p, plan.pp > 1, plan.ep > 1 ? e : -1),
                                 "/", kMegatronRankFileName);
        // Megatron-LM nests the model's modules; Megatron-Core saves one flat state dict.
        StructureNode model_node;
        model_node.kind = Kind::kDict;
        model_node.ordered = core;
        StructureNode* language_model =
            core ? nullptr : &ChildDict(model_node, "language_model", false);
        // Adds `tensor` under its file name: `module` and `key` place it in Megatron-LM's nesting.
        auto add = [&](OutputTensor tensor, StructureNode* module, const std::string& key) {
          if (core) {
            AddTensor(model_node, tensor.name, tensor.name);
          } else {
            AddTensor(*module, key, tensor.name);
          }
          file.tensors.push_back(std::move(tensor));
        };
        for (size_t i = 0; i < parts[t].size(); ++i) {
          const Placement& where = placements[t][i];
          OutputTensor tensor = parts[t][i];
          tensor.alias_of = -1;
          switch (where.part) {
            case Placement::Part::kEmbedding: {
              if (!first) continue;
              if (IsWordEmbeddings(tensor.name)) repad(tensor, t);
              if (core) {
                add(std::move(tensor), nullptr, "");
                break;
              }
              auto [module, key] = SplitModule(where.rest);
              StructureNode& embedding = ChildDict(*language_model, "embedding", false);
              add(std::move(tensor), &ChildDict(embedding, module, true), key);
              break;
            }
            case Placement::Part::kLayer: {
              if (where.layer / plan.layers_per_stage != p) continue;
              std::string rest = where.rest;
              if (const std::optional<ExpertTensorName> expert = ParseExpertTensorName(rest)) {
                // Global expert g is local expert g % E_local of EP rank g / E_local.
                if (expert->local / plan.local_experts != e) continue;
                rest = LocalExpertTensorName(*expert, expert->local % plan.local_experts,
                                             plan.grouped_experts);
              }
              const std::string key =
                  absl::StrCat("layers.", where.layer % plan.layers_per_stage, ".", rest);
              tensor.name = absl::StrCat(FilePrefix(where), key);
              add(std::move(tensor),
                  core ? nullptr : &ChildDict(*language_model, where.encoder_key, true), key);
              break;
            }
            case Placement::Part::kEncoderTail:
              if (!last) continue;
              add(std::move(tensor),
                  core ? nullptr : &ChildDict(*language_model, where.encoder_key, true),
                  where.rest);
              break;
            case Placement::Part::kOutputLayer:
              if (!last) continue;
              repad(tensor, t);
              add(std::move(tensor),
                  core ? nullptr : &ChildDict(*language_model, "output_layer", true), where.rest);
              break;
          }
        }
        // The last stage's copy of the tied word embeddings, which Megatron keeps in sync:
        // Megatron-LM's word_embeddings_for_head, Megatron-Core's output_layer.
        if (last && !first && !untied) {
          for (size_t i = 0; i < parts[t].size(); ++i) {
            if (!IsWordEmbeddings(parts[t][i].name)) continue;
            OutputTensor copy = parts[t][i];
            copy.alias_of = -1;
            repad(copy, t);
            copy.name = core ? kCoreOutputLayer : kMegatronHeadCopyName;
            add(std::move(copy),
                core ? nullptr : &ChildDict(model_node, "word_embeddings_for_head", true),
                "weight");
          }
        }
        // The file: args, checkpoint_version, iteration, model (Megatron's save order).
        auto root = std::make_shared<StructureNode>();
        root->kind = Kind::kDict;
        if (plan.args.has_value()) {
          root->keys.push_back(StructureNode::String("args"));
          root->values.push_back(FileArgs(plan, t, p, e));
        }
        if (plan.checkpoint_version.has_value()) {
          StructureNode version;
          version.kind = Kind::kFloat;
          version.real = *plan.checkpoint_version;
          root->keys.push_back(StructureNode::String("checkpoint_version"));
          root->values.push_back(version);
        }
        root->keys.push_back(StructureNode::String("iteration"));
        root->values.push_back(StructureNode::Int(plan.iteration.value_or(0)));
        root->keys.push_back(StructureNode::String("model"));
        root->values.push_back(std::move(model_node));
        file.structure = std::move(root);
        arranged.layout.files.push_back(std::move(file));
      }
    }
  }
  return arranged;
}

absl::StatusOr<bool> MegatronOutput::PresentInput(const std::string& input, int parts,
                                                  int pipeline_parts, const HfExportOptions& hf,
                                                  InputModel& model, Catalog& catalog) const {
  if (model.format == kTorchDistId) {
    // A mixture-of-experts model keeps Megatron-Core's names (layers and experts unstacked by
    // the reader, experts under global ids): Megatron-LM builds such layers only as
    // Megatron-Core modules, which it saves under these names in the same rank folders.
    const bool experts = std::any_of(
        catalog.tensors.begin(), catalog.tensors.end(),
        [](const CatalogTensor& tensor) { return ParseExpertTensorName(tensor.name).has_value(); });
    // A dense one takes Megatron-LM's names; the tensors hold the same values (the global QKV
    // in query groups, the gated fc1 as [gate; up]), and the reader's rules split them on the
    // axes Megatron-Core's names give.
    std::vector<CatalogTensor> renamed;
    for (CatalogTensor& tensor : catalog.tensors) {
      std::optional<std::string> name = tensor.name;
      if (experts) {
        // TransformerEngine's FP8 metadata, which the torch.save files do not hold.
        if (absl::EndsWith(tensor.name, "._extra_state")) name = std::nullopt;
      } else {
        ASSIGN_OR_RETURN(name, MegatronLmName(tensor.name),
                         absl::StrCat(input, ": a Megatron-Core torch_dist checkpoint"));
      }
      if (!name.has_value()) continue;
      tensor.name = *std::move(name);
      renamed.push_back(std::move(tensor));
    }
    catalog.tensors = std::move(renamed);
    catalog.structure = nullptr;  // placed by name, as the megatron reader's merged model
    catalog.Reindex();
    if (experts) {
      // The files are torch.save ones (--ckpt-format torch), whatever the run saved with.
      if (auto args = model.training_state.values.find("megatron.args");
          args != model.training_state.values.end()) {
        SetIfPresent(args->second.Attributes(), "ckpt_format", StructureNode::String("torch"));
      }
      model.description =
          absl::StrCat(model.description, "; Megatron-Core names kept (mixture-of-experts)");
    } else {
      model.description = absl::StrCat(model.description, "; Megatron-Core names as Megatron-LM's");
    }
    return true;
  }
  return PresentHfModelAsMegatron(input, parts, pipeline_parts, kImportAsMegatronLm, hf, model,
                                  catalog);
}

absl::StatusOr<FileFraming> MegatronOutput::Frame(const OutputFileLayout& file) const {
  return torch_.Frame(file);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> MegatronOutput::CompanionFiles(
    const TargetLayout& layout) const {
  std::vector<std::pair<std::string, std::string>> files;
  if (layout.files.empty()) return files;
  ASSIGN_OR_RETURN(std::string text, TrackerTextFor(layout.files[0].name));
  files.emplace_back(kTrackerName, std::move(text));
  return files;
}

namespace {
const OutputFormatRegistration<MegatronOutput> register_output;
}  // namespace

}  // namespace reshard
