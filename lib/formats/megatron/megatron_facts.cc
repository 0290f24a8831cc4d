#include "lib/formats/megatron/megatron_facts.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/formats/torch/pickle_structure.h"
#include "lib/formats/torch/torch_format.h"

namespace reshard {
namespace megatron_internal {
namespace {

using Kind = PickleValue::Kind;

// Args that define the model or its split; they must agree across the files of a checkpoint.
// (Per-process args such as `rank` legitimately differ and are not compared.)
const char* const kComparedArgs[] = {
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "kv_channels",
    "group_query_attention",
    "num_query_groups",
    "num_key_value_heads",
    "padded_vocab_size",
    "make_vocab_size_divisible_by",
    "max_position_embeddings",
    "position_embedding_type",
    "swiglu",
    "untie_embeddings_and_output_weights",
    "num_experts",
    "expert_model_parallel_size",
    "standalone_embedding_stage",
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "params_dtype",
};

}  // namespace

std::string FormatFloat(double value) {
  std::string text = absl::StrFormat("%.17g", value);
  // The shortest form that reads back the same value.
  for (int digits = 1; digits < 17; ++digits) {
    std::string shorter = absl::StrFormat("%.*g", digits, value);
    double back = 0;
    if (absl::SimpleAtod(shorter, &back) && back == value) {
      text = std::move(shorter);
      break;
    }
  }
  if (text.find_first_of(".eni") == std::string::npos) text += ".0";
  return text;
}

ArgValue RenderValue(const PickleValue* value) {
  switch (value->kind) {
    case Kind::kNone:
      return {"None", std::nullopt};
    case Kind::kBool:
      return {value->boolean ? "True" : "False", value->boolean ? 1 : 0};
    case Kind::kInt:
      return {absl::StrCat(value->integer), value->integer};
    case Kind::kFloat:
      return {FormatFloat(value->real), std::nullopt};
    case Kind::kString:
      return {absl::StrCat("'", absl::CEscape(value->text), "'"), std::nullopt};
    case Kind::kGlobal:
      return {absl::StrCat(value->module, ".", value->name), std::nullopt};
    default:
      return {DescribePickleValue(value), std::nullopt};
  }
}

ArgMap ReadArgs(const PickleValue* args) {
  ArgMap result;
  auto read = [&](const char* key) {
    if (const PickleValue* value = PickleField(args, key); value != nullptr) {
      result[key] = RenderValue(value);
    }
  };
  for (const char* key : kComparedArgs) read(key);
  for (const char* key : kUnevenStageArgs) read(key);
  return result;
}

std::optional<int64_t> ArgNumber(const ArgMap& args, absl::string_view key) {
  auto it = args.find(std::string(key));
  if (it == args.end()) return std::nullopt;
  return it->second.number;
}

int64_t QkvUnitRows(const ArgMap& args) {
  return QkvUnitRowsOfArgs([&](absl::string_view key) { return ArgNumber(args, key); });
}

std::optional<double> PickleNumber(const PickleValue* value) {
  if (value == nullptr) return std::nullopt;
  if (value->kind == Kind::kFloat) return value->real;
  if (value->kind == Kind::kInt) return static_cast<double>(value->integer);
  return std::nullopt;
}

absl::StatusOr<Catalog> StateDictCatalog(const TorchArchive& archive, const PickleValue* value,
                                         const std::string& prefix) {
  ASSIGN_OR_RETURN(Catalog catalog, CatalogFromValue(archive, value, prefix));
  catalog.format = kMegatronFormatId;
  catalog.structure = nullptr;  // parts are merged by name; the nesting is not kept
  return catalog;
}

void NoteTopLevel(const PickleValue* root, const std::vector<std::string>& skip,
                  std::vector<std::string>& notes, const std::vector<std::string>& carried) {
  const auto* entries = PickleEntries(root);
  if (entries == nullptr) return;
  for (const auto& [key, value] : *entries) {
    if (key->kind != Kind::kString) continue;
    if (std::find(skip.begin(), skip.end(), key->text) != skip.end()) continue;
    if (key->text == "optimizer" && value->kind != Kind::kNone) {
      notes.push_back(
          "optimizer: not read (Megatron keeps optimizer state by parameter index, not by tensor "
          "name)");
      continue;
    }
    // The merged parts have no nesting to carry these in (Catalog::structure is null); the
    // Megatron outputs take some from the training state.
    const bool to_megatron = std::find(carried.begin(), carried.end(), key->text) != carried.end();
    notes.push_back(absl::StrCat(
        key->text, ": ", RenderValue(value).text,
        to_megatron ? " (carried to --format megatron and megatron-torch-dist output)"
                    : " (not carried to any output)"));
  }
}

FileFacts ReadFacts(const PickleValue* root, std::string name) {
  FileFacts facts;
  facts.name = std::move(name);
  const PickleValue* args = PickleField(root, "args");
  if (args != nullptr && args->kind != Kind::kNone) {
    facts.has_args = true;
    facts.args = ReadArgs(args);
  }
  facts.iteration = PickleInt(PickleField(root, "iteration"));
  facts.version = PickleNumber(PickleField(root, "checkpoint_version"));
  return facts;
}

std::map<std::string, StructureNode> CarriedValues(const PickleValue* root, const FileFacts& facts,
                                                   std::vector<std::string>& notes) {
  std::map<std::string, StructureNode> values;
  if (const PickleValue* args = PickleField(root, "args");
      args != nullptr && args->kind != Kind::kNone) {
    absl::StatusOr<StructureNode> node = PickleToStructure(args);
    if (node.ok()) {
      values["megatron.args"] = *std::move(node);
    } else {
      notes.push_back(absl::StrCat("args: not carried to --format megatron output (",
                                   node.status().message(), ")"));
    }
  }
  if (facts.iteration.has_value()) {
    StructureNode iteration;
    iteration.kind = StructureNode::Kind::kInt;
    iteration.integer = *facts.iteration;
    values["megatron.iteration"] = iteration;
  }
  if (facts.version.has_value()) {
    StructureNode version;
    version.kind = StructureNode::Kind::kFloat;
    version.real = *facts.version;
    values["megatron.checkpoint_version"] = version;
  }
  return values;
}

absl::Status CompareFacts(const FileFacts& reference, const FileFacts& other,
                          absl::string_view what) {
  auto disagree = [&](absl::string_view field, absl::string_view a, absl::string_view b) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", other.name, " has ", field, " = ", b,
                                                   " but ", reference.name, " has ", a,
                                                   " (the files are not from one checkpoint)"));
  };
  if (reference.has_args != other.has_args) {
    return disagree("args", reference.has_args ? "a Namespace" : "none",
                    other.has_args ? "a Namespace" : "none");
  }
  for (const char* key : kComparedArgs) {
    auto a = reference.args.find(key);
    auto b = other.args.find(key);
    const std::string a_text = a == reference.args.end() ? "(absent)" : a->second.text;
    const std::string b_text = b == other.args.end() ? "(absent)" : b->second.text;
    if (a_text != b_text) return disagree(absl::StrCat("args.", key), a_text, b_text);
  }
  if (reference.iteration != other.iteration) {
    return disagree("iteration",
                    reference.iteration ? absl::StrCat(*reference.iteration) : "(absent)",
                    other.iteration ? absl::StrCat(*other.iteration) : "(absent)");
  }
  if (reference.version != other.version) {
    return disagree("checkpoint_version",
                    reference.version ? FormatFloat(*reference.version) : "(absent)",
                    other.version ? FormatFloat(*other.version) : "(absent)");
  }
  return absl::OkStatus();
}

absl::Status CheckVersion(const FileFacts& facts, absl::string_view what, bool required) {
  if (!facts.version.has_value() && !required) return absl::OkStatus();
  const double version = facts.version.value_or(0);
  if (version < 2.0) {
    return absl::UnimplementedError(absl::StrCat(
        what, ": ", facts.name, " has checkpoint_version ",
        facts.version ? FormatFloat(version) : "(absent, so 0)",
        "; before version 2.0 query_key_value is not stored per attention head, so it cannot be "
        "merged or split by rows. Load and save it once with Megatron (which reorders it) first"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> DecideSwiGLU(const FileFacts& facts, const Catalog& part,
                                  absl::string_view what) {
  std::optional<bool> from_args;
  if (auto swiglu = ArgNumber(facts.args, "swiglu"); swiglu.has_value()) {
    from_args = *swiglu != 0;
  }
  const std::optional<bool> from_shapes = SwiGLUFromShapes(part);
  if (from_args.has_value() && from_shapes.has_value() && *from_args != *from_shapes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": args.swiglu is ", *from_args ? "True" : "False",
        " but the first layer's mlp.dense_h_to_4h.weight is ", *from_shapes ? "" : "not ",
        "twice as tall as its mlp.dense_4h_to_h.weight is wide (a SwiGLU MLP holds [gate; up])"));
  }
  return from_args.value_or(from_shapes.value_or(false));
}

absl::Status CheckPaddedVocab(const FileFacts& facts, const Catalog& part, int tp,
                              absl::string_view what) {
  const std::optional<int64_t> padded = ArgNumber(facts.args, "padded_vocab_size");
  if (!padded.has_value()) return absl::OkStatus();
  // Megatron pads the word embeddings and the untied output layer alike (Megatron-LM's and
  // Megatron-Core's names, the latter in the same rank files).
  for (const CatalogTensor& tensor : part.tensors) {
    const bool vocabulary = tensor.name == "word_embeddings.weight" ||
                            absl::EndsWith(tensor.name, ".word_embeddings.weight") ||
                            tensor.name == "output_layer.weight" ||
                            absl::EndsWith(tensor.name, ".output_layer.weight");
    if (!vocabulary) continue;
    const int64_t rows = tensor.shape.empty() ? 0 : tensor.shape[0];
    if (rows * tp == *padded) continue;
    const std::string file = tensor.pieces.empty() || static_cast<size_t>(tensor.pieces[0].file) >= part.files.size()
                                 ? std::string("the checkpoint")
                                 : part.files[tensor.pieces[0].file].path;
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": tensor \"", tensor.name, "\" of ", file, " has ", rows, " rows, ", rows * tp,
        " over TP ", tp, ", but args.padded_vocab_size is ", *padded,
        " (Megatron pads the vocabulary of the word embeddings and the output layer to it)"));
  }
  return absl::OkStatus();
}

absl::Status CompareNames(const Catalog& a, const std::string& a_name, const Catalog& b,
                          const std::string& b_name, absl::string_view what) {
  absl::flat_hash_set<std::string> in_a, in_b;
  for (const CatalogTensor& tensor : a.tensors) in_a.insert(tensor.name);
  for (const CatalogTensor& tensor : b.tensors) in_b.insert(tensor.name);
  for (const CatalogTensor& tensor : b.tensors) {
    if (!in_a.contains(tensor.name)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", b_name, " holds tensor \"",
                                                     tensor.name, "\" that ", a_name, " lacks"));
    }
  }
  for (const CatalogTensor& tensor : a.tensors) {
    if (!in_b.contains(tensor.name)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", b_name, " lacks tensor \"",
                                                     tensor.name, "\" that ", a_name, " holds"));
    }
  }
  return absl::OkStatus();
}

std::string Topology(absl::string_view framework, int tp, int pp) {
  return absl::StrCat(framework, " TP", tp, " x PP", pp);
}

}  // namespace megatron_internal
}  // namespace reshard
