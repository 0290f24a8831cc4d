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
#include "lib/formats/megatron/megatron_layout.h"

namespace reshard {
namespace {

using Kind = StructureNode::Kind;

constexpr char kTrackerName[] = "latest_checkpointed_iteration.txt";
constexpr char kWordEmbeddings[] = "language_model.embedding.word_embeddings.weight";
constexpr char kOutputLayer[] = "language_model.output_layer.weight";

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
  std::string encoder_key;  // "encoder" or "transformer"
  int64_t layer = -1;       // kLayer: the global layer index
  std::string rest;         // below the module: "word_embeddings.weight", "mlp.dense_4h_to_h.bias"
};

absl::StatusOr<Placement> Place(const std::string& name) {
  auto unknown = [&]() {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", name,
        "\" is not part of a Megatron-LM GPT's embedding, encoder or output layer, so the "
        "megatron output cannot place it"));
  };
  Placement placement;
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, "language_model.")) return unknown();
  if (absl::ConsumePrefix(&rest, "embedding.")) {
    placement.part = Placement::Part::kEmbedding;
  } else if (absl::ConsumePrefix(&rest, "output_layer.")) {
    placement.part = Placement::Part::kOutputLayer;
  } else {
    for (const char* key : {"encoder", "transformer"}) {
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
  int64_t layers_per_stage = 0;
  int64_t vocab_rows = -1;  // rows of word_embeddings (and output_layer) in all; -1: unchanged
  std::string folder;       // "iter_0000100" or "release"
  std::optional<StructureNode> args;
  std::optional<double> checkpoint_version;
  std::optional<int64_t> iteration;
  int64_t data_parallel = 1;
};

// The padded vocabulary for `tp`, as Megatron's _vocab_size_with_padding computes it.
absl::StatusOr<int64_t> PaddedVocab(const StructureNode* args, int64_t rows_in, int tp) {
  const std::optional<int64_t> divisible = IntArg(args, "make_vocab_size_divisible_by");
  if (!divisible.has_value() || *divisible < 1) return rows_in;  // nothing to pad to: keep
  const int64_t multiple = *divisible * tp;
  const std::optional<int64_t> vocab = IntArg(args, "vocab_size");
  if (vocab.has_value() && *vocab > 0) {
    if (*vocab > rows_in) {
      return absl::InvalidArgumentError(absl::StrCat(
          "args.vocab_size is ", *vocab, " but ", kWordEmbeddings, " has only ", rows_in, " rows"));
    }
    return (*vocab + multiple - 1) / multiple * multiple;
  }
  if (rows_in % multiple == 0) return rows_in;
  return absl::InvalidArgumentError(absl::StrCat(
      "the vocabulary must be padded again for TP ", tp, " (to a multiple of ",
      "args.make_vocab_size_divisible_by ", *divisible, " x ", tp, " = ", multiple,
      "), but the args do not record the original vocabulary size (args.vocab_size) and the ",
      rows_in, " padded rows of ", kWordEmbeddings, " are no such multiple"));
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

// The args of the file of (t, p).
StructureNode FileArgs(const Plan& plan, int t, int p) {
  StructureNode args = *plan.args;
  StructureNode* attributes = args.Attributes();
  SetIfPresent(attributes, "tensor_model_parallel_size", StructureNode::Int(plan.tp));
  SetIfPresent(attributes, "pipeline_model_parallel_size", StructureNode::Int(plan.pp));
  if (plan.vocab_rows > 0)
    SetIfPresent(attributes, "padded_vocab_size", StructureNode::Int(plan.vocab_rows));
  SetIfPresent(attributes, "world_size",
               StructureNode::Int(int64_t{plan.tp} * plan.pp * plan.data_parallel));
  // Megatron's default rank order (tp fastest, then dp, then pp), at data-parallel rank 0.
  SetIfPresent(attributes, "rank",
               StructureNode::Int(t + int64_t{plan.tp} * plan.data_parallel * p));
  // The layers are balanced evenly over PP stages, without virtual stages.
  for (const char* key :
       {"virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
        "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"}) {
    SetIfPresent(attributes, key, StructureNode());
  }
  for (const char* key : {"standalone_embedding_stage", "account_for_embedding_in_pipeline_split",
                          "account_for_loss_in_pipeline_split"}) {
    StructureNode no;
    no.kind = Kind::kBool;
    SetIfPresent(attributes, key, no);
  }
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
  // Megatron input, or a Hugging Face model PresentInput made a Megatron-LM one.
  if (model.format != kMegatronFormatId &&
      model.training_state.Value(kHfImportFamilyKey) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the megatron output writes Megatron-LM checkpoints from Megatron input (its args, "
        "iteration and layer layout) or from a Hugging Face model (safetensors and "
        "config.json), not from ",
        model.format, " input"));
  }
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
      if (tensor.name == kOutputLayer) untied = true;
      placements[t].push_back(std::move(placement));
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
  for (const OutputTensor& tensor : parts[0]) {
    if (tensor.name == kWordEmbeddings) {
      rows_in = request.catalog.tensors[tensor.source].shape.at(0);
    }
  }
  if (rows_in > 0) {
    ASSIGN_OR_RETURN(plan.vocab_rows, PaddedVocab(args, rows_in, plan.tp));
    if (plan.vocab_rows % plan.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(kWordEmbeddings, ": ", plan.vocab_rows,
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
      const bool first = p == 0;
      const bool last = p == plan.pp - 1;
      OutputFileLayout file;
      file.name = absl::StrCat(plan.folder, "/", MegatronRankDirName(t, p, plan.pp > 1), "/",
                               kMegatronRankFileName);
      StructureNode model_node;
      model_node.kind = Kind::kDict;
      StructureNode* language_model = &ChildDict(model_node, "language_model", false);
      for (size_t i = 0; i < parts[t].size(); ++i) {
        const Placement& where = placements[t][i];
        OutputTensor tensor = parts[t][i];
        tensor.alias_of = -1;
        switch (where.part) {
          case Placement::Part::kEmbedding: {
            if (!first) continue;
            auto [module, key] = SplitModule(where.rest);
            StructureNode& embedding = ChildDict(*language_model, "embedding", false);
            if (tensor.name == kWordEmbeddings) repad(tensor, t);
            AddTensor(ChildDict(embedding, module, true), key, tensor.name);
            break;
          }
          case Placement::Part::kLayer: {
            if (where.layer / plan.layers_per_stage != p) continue;
            const std::string key =
                absl::StrCat("layers.", where.layer % plan.layers_per_stage, ".", where.rest);
            tensor.name = absl::StrCat("language_model.", where.encoder_key, ".", key);
            AddTensor(ChildDict(*language_model, where.encoder_key, true), key, tensor.name);
            break;
          }
          case Placement::Part::kEncoderTail:
            if (!last) continue;
            AddTensor(ChildDict(*language_model, where.encoder_key, true), where.rest, tensor.name);
            break;
          case Placement::Part::kOutputLayer:
            if (!last) continue;
            repad(tensor, t);
            AddTensor(ChildDict(*language_model, "output_layer", true), where.rest, tensor.name);
            break;
        }
        file.tensors.push_back(std::move(tensor));
      }
      // The last stage's copy of the tied word embeddings, which Megatron keeps in sync.
      if (last && !first && !untied) {
        for (size_t i = 0; i < parts[t].size(); ++i) {
          if (parts[t][i].name != kWordEmbeddings) continue;
          OutputTensor copy = parts[t][i];
          copy.alias_of = -1;
          repad(copy, t);
          copy.name = kMegatronHeadCopyName;
          AddTensor(ChildDict(model_node, "word_embeddings_for_head", true), "weight", copy.name);
          file.tensors.push_back(std::move(copy));
        }
      }
      // The file: args, checkpoint_version, iteration, model (Megatron's save order).
      auto root = std::make_shared<StructureNode>();
      root->kind = Kind::kDict;
      if (plan.args.has_value()) {
        root->keys.push_back(StructureNode::String("args"));
        root->values.push_back(FileArgs(plan, t, p));
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
  return arranged;
}

absl::StatusOr<bool> MegatronOutput::PresentInput(const std::string& input, int parts,
                                                  int pipeline_parts, const HfExportOptions& hf,
                                                  InputModel& model, Catalog& catalog) const {
  return PresentHfModelAsMegatron(input, parts, pipeline_parts, "Megatron-LM", hf, model,
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
