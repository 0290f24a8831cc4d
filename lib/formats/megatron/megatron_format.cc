#include "lib/formats/megatron/megatron_format.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/formats/torch/torch_format.h"
#include "lib/plan/partition_rules.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

constexpr char kRankFileName[] = "model_optim_rng.pt";
constexpr char kHeadCopyName[] = "word_embeddings_for_head.weight";
// Ranks and layer indices above this are not real checkpoints; the bound keeps loops small.
constexpr int kMaxIndex = 1 << 20;

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

// Args that make pipeline stages hold unequal numbers of layers.
const char* const kUnevenStageArgs[] = {
    "standalone_embedding_stage",         "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",   "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
};

// --------------------------------------------------------------------------- names

// A run of digits as an index in [0, kMaxIndex).
std::optional<int> ParseIndex(absl::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value >= kMaxIndex) return std::nullopt;
  return value;
}

// "mp_rank_03_model_states.pt" -> 3 (DeepSpeed's per model-parallel-rank file).
std::optional<int> ParseModelStatesFile(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "mp_rank_") || !absl::ConsumeSuffix(&name, "_model_states.pt")) {
    return std::nullopt;
  }
  return ParseIndex(name);
}

// --------------------------------------------------------------------------- folders

enum class Layout { kNone, kMegatronLM, kDeepSpeedPipe };

// What a folder holds: Megatron-LM rank folders (mp_rank_XX[_YYY], with or without their
// model file: Read says which file is missing) or DeepSpeed pipeline layer files.
Layout Classify(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return Layout::kNone;
  bool megatron = false;
  fs::directory_iterator it(dir, error);
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    const std::string name = it->path().filename().string();
    std::error_code entry_error;
    if (ParsePipeLayerFile(name).has_value() && it->is_regular_file(entry_error)) {
      return Layout::kDeepSpeedPipe;
    }
    if (!megatron && ParseMegatronRankDir(name).has_value() && it->is_directory(entry_error)) {
      megatron = true;
    }
  }
  return megatron ? Layout::kMegatronLM : Layout::kNone;
}

// The iter_*, release and global_step* folders directly in `path` that hold a checkpoint, in
// natural order.
std::vector<std::string> CheckpointSubfolders(const std::string& path) {
  std::vector<std::string> found;
  std::error_code error;
  fs::directory_iterator it(path, error);
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, "iter_") && name != "release" &&
        !absl::StartsWith(name, "global_step")) {
      continue;
    }
    if (Classify(it->path().string()) != Layout::kNone) found.push_back(name);
  }
  std::sort(found.begin(), found.end(), NaturalLess);
  return found;
}

struct Resolved {
  std::string dir;   // the checkpoint folder itself
  std::string name;  // its name: "iter_0000100", "release", "global_step100"
  Layout layout = Layout::kNone;
};

// The checkpoint folder `path` stands for: itself, the folder `tag` names inside it, or the
// folder its tracker file names (DeepSpeed's `latest` first, since Megatron-DeepSpeed writes
// both trackers, then Megatron's latest_checkpointed_iteration.txt).
absl::StatusOr<Resolved> ResolveCheckpoint(const std::string& path, const std::string& tag) {
  auto at = [&](const std::string& name) -> std::optional<Resolved> {
    const std::string dir = JoinPath(path, name);
    const Layout layout = Classify(dir);
    if (layout == Layout::kNone) return std::nullopt;
    return Resolved{dir, name, layout};
  };
  if (!tag.empty()) {
    std::vector<std::string> names = {tag};
    if (ParseIndex(tag).has_value()) {
      names.push_back(*IterationFolderFromTracker(tag));
      names.push_back(absl::StrCat("global_step", tag));
    }
    for (const std::string& name : names) {
      if (!IsPlainPathComponent(name)) continue;
      if (auto found = at(name); found.has_value()) return *found;
    }
    return absl::NotFoundError(absl::StrCat(
        path, ": --tag ", tag, " names no Megatron checkpoint folder here (looked for ",
        absl::StrJoin(names, ", "),
        " holding mp_rank_* folders or DeepSpeed pipeline layer files)"));
  }
  if (const Layout layout = Classify(path); layout != Layout::kNone) {
    return Resolved{path, BaseName(path), layout};
  }
  ASSIGN_OR_RETURN(const std::optional<std::string> latest,
                   ReadTrackerFile(JoinPath(path, kDeepSpeedTrackerName)));
  if (latest.has_value() && IsPlainPathComponent(*latest)) {
    if (auto found = at(*latest); found.has_value()) return *found;
  }
  const std::string tracker_path = JoinPath(path, kMegatronTrackerName);
  ASSIGN_OR_RETURN(const std::optional<std::string> tracker, ReadTrackerFile(tracker_path));
  if (tracker.has_value()) {
    const std::optional<std::string> name = IterationFolderFromTracker(*tracker);
    if (!name.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(tracker_path, ": expected an iteration number or \"release\", but found \"",
                       absl::CEscape(absl::StripAsciiWhitespace(*tracker)), "\""));
    }
    if (auto found = at(*name); found.has_value()) return *found;
    return absl::NotFoundError(
        absl::StrCat(tracker_path, " names ", *name, ", but ", JoinPath(path, *name),
                     " holds no mp_rank_* folders nor DeepSpeed pipeline layer files"));
  }
  if (std::vector<std::string> found = CheckpointSubfolders(path); !found.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds the checkpoint folders ", absl::StrJoin(found, ", "),
                     " but no tracker file (", kMegatronTrackerName, ", ", kDeepSpeedTrackerName,
                     ") saying which to read; pass --tag with one of them"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path,
      ": not a Megatron checkpoint: no mp_rank_XX[_YYY]/model_optim_rng.pt folders, no DeepSpeed "
      "pipeline layer files (layer_XX-model_YY-model_states.pt), and no tracker file (",
      kMegatronTrackerName, ", ", kDeepSpeedTrackerName, ") naming a folder that holds them"));
}

// --------------------------------------------------------------------------- pickle values

// One arg (or other plain value) as Python would print it; `number` for ints and bools.
struct ArgValue {
  std::string text;
  std::optional<int64_t> number;
};
using ArgMap = std::map<std::string, ArgValue>;

// As Python's repr: 3.0, 0.0001, 1e-08.
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

// Rows of query_key_value that belong to one attention head (with grouped-query attention: one
// head group, its query heads plus one key and one value head), which a tensor-parallel split
// must keep together; 1 when the args do not say.
int64_t QkvUnitRows(const ArgMap& args) {
  const std::optional<int64_t> heads = ArgNumber(args, "num_attention_heads");
  if (!heads.has_value() || *heads <= 0 || *heads > kMaxIndex) return 1;
  std::optional<int64_t> head_dim = ArgNumber(args, "kv_channels");
  if (!head_dim.has_value() || *head_dim <= 0) {
    const std::optional<int64_t> hidden = ArgNumber(args, "hidden_size");
    if (!hidden.has_value() || *hidden <= 0 || *hidden % *heads != 0) return 1;
    head_dim = *hidden / *heads;
  }
  if (*head_dim > kMaxIndex) return 1;
  int64_t groups = *heads;
  if (ArgNumber(args, "group_query_attention").value_or(0) != 0) {
    groups = ArgNumber(args, "num_query_groups").value_or(*heads);
  } else if (auto kv = ArgNumber(args, "num_key_value_heads"); kv.has_value() && *kv > 0) {
    groups = *kv;  // Megatron-DeepSpeed's name for the same thing
  }
  if (groups <= 0 || *heads % groups != 0) return 1;
  return (*heads / groups + 2) * *head_dim;
}

std::optional<double> PickleNumber(const PickleValue* value) {
  if (value == nullptr) return std::nullopt;
  if (value->kind == Kind::kFloat) return value->real;
  if (value->kind == Kind::kInt) return static_cast<double>(value->integer);
  return std::nullopt;
}

// The tensors of a state dict inside `archive` (nested dicts, as Megatron's
// state_dict_for_save_checkpoint makes them) as a Catalog of one source file, named by their
// dotted key path below `prefix`; plain values are listed in other_entries.
absl::StatusOr<Catalog> StateDictCatalog(const TorchArchive& archive, const PickleValue* value,
                                         const std::string& prefix) {
  ASSIGN_OR_RETURN(Catalog catalog, CatalogFromValue(archive, value, prefix));
  catalog.format = MegatronInput::kId;
  catalog.structure = nullptr;  // parts are merged by name; the nesting is not kept
  return catalog;
}

// The plain values of a checkpoint file (iteration, args, ...), for `inspect`.
void NoteTopLevel(const PickleValue* root, const std::vector<std::string>& skip,
                  std::vector<std::string>& notes) {
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
    // The merged parts have no nesting to carry these in (Catalog::structure is null).
    notes.push_back(
        absl::StrCat(key->text, ": ", RenderValue(value).text, " (not carried to any output)"));
  }
}

// What two files of one checkpoint must agree on.
struct FileFacts {
  std::string name;  // relative to the checkpoint folder, for messages
  bool has_args = false;
  ArgMap args;
  std::optional<int64_t> iteration;
  std::optional<double> version;
};

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

// Refuses query_key_value orderings older than Megatron's checkpoint version 2.0.
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

// Whether the model is SwiGLU: args.swiglu when present (checked against the shapes), else the
// shapes.
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

// word_embeddings rows x TP must be args.padded_vocab_size.
absl::Status CheckPaddedVocab(const FileFacts& facts, const Catalog& part, int tp,
                              absl::string_view what) {
  const std::optional<int64_t> padded = ArgNumber(facts.args, "padded_vocab_size");
  if (!padded.has_value()) return absl::OkStatus();
  for (const CatalogTensor& tensor : part.tensors) {
    if (tensor.name != "word_embeddings.weight" &&
        !absl::EndsWith(tensor.name, ".word_embeddings.weight")) {
      continue;
    }
    if (tensor.shape.empty() || tensor.shape[0] * tp != *padded) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", tensor.name, " has ", tensor.shape.empty() ? 0 : tensor.shape[0],
                       " rows per TP rank (", tensor.shape.empty() ? 0 : tensor.shape[0] * tp,
                       " over ", tp, " ranks), but args.padded_vocab_size is ", *padded));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Names of `a` missing from `b`, and the other way round, as an error naming the files.
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

// --------------------------------------------------------------------------- Megatron-LM

// One model_optim_rng.pt, read.
struct RankFile {
  std::string label;  // the rank folder, "mp_rank_00_001"
  FileFacts facts;
  std::vector<Catalog> chunks;  // `model`, or `model0`, `model1`, ... (virtual stages)
  std::vector<std::string> notes;
};

absl::StatusOr<RankFile> ReadRankFile(const std::string& dir, const std::string& label) {
  const std::string relative = absl::StrCat(label, "/", kRankFileName);
  const std::string path = JoinPath(dir, relative);
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(path));
  const PickleValue* root = archive->root();
  if (PickleEntries(root) == nullptr) {
    return absl::DataLossError(
        absl::StrCat(path, ": expected a dict at the top, found ", DescribePickleValue(root)));
  }
  RankFile file;
  file.label = label;
  file.facts = ReadFacts(root, relative);
  std::vector<std::string> model_keys;
  if (PickleField(root, "model") != nullptr) {
    model_keys.push_back("model");
  } else {
    for (int v = 0; v < kMaxIndex && PickleField(root, absl::StrCat("model", v)) != nullptr; ++v) {
      model_keys.push_back(absl::StrCat("model", v));
    }
  }
  if (model_keys.empty()) {
    return absl::DataLossError(absl::StrCat(
        path, ": no `model` entry (nor model0, model1, ... for virtual pipeline stages)"));
  }
  for (const std::string& key : model_keys) {
    ASSIGN_OR_RETURN(Catalog catalog, StateDictCatalog(*archive, PickleField(root, key), ""));
    for (std::string& note : catalog.other_entries) file.notes.push_back(std::move(note));
    catalog.other_entries.clear();
    file.chunks.push_back(std::move(catalog));
  }
  NoteTopLevel(root, model_keys, file.notes);
  return file;
}

absl::StatusOr<InputModel> ReadMegatronLM(const Resolved& where) {
  const std::string& dir = where.dir;
  // The rank folders present: (tp, pp) -> name.
  std::map<std::pair<int, int>, std::string> present;
  std::error_code error;
  for (fs::directory_iterator it(dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    const std::optional<MegatronRankDir> rank = ParseMegatronRankDir(name);
    std::error_code entry_error;
    if (!rank.has_value() || !it->is_directory(entry_error)) continue;
    if (rank->ep >= 0) {
      return absl::UnimplementedError(absl::StrCat(
          dir, ": ", name,
          " is an expert-parallel rank folder (mp_rank_TP_PP_EP); expert-parallel Megatron "
          "checkpoints are not supported"));
    }
    auto [slot, inserted] = present.emplace(std::make_pair(rank->tp, rank->pp), name);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": ", slot->second, " and ", name,
                                                     " are both TP rank ", rank->tp, ", PP rank ",
                                                     rank->pp));
    }
  }
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing ", dir));
  if (present.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no mp_rank_* folders"));
  }

  // Topology: from the args of the first file there is, else from the folder names.
  std::string first_label;
  for (const auto& [rank, name] : present) {
    if (fs::is_regular_file(JoinPath(JoinPath(dir, name), kRankFileName), error)) {
      first_label = name;
      break;
    }
  }
  if (first_label.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": Megatron: ", present.begin()->second,
                                                   "/", kRankFileName,
                                                   " is missing (no rank folder holds its file)"));
  }
  ASSIGN_OR_RETURN(RankFile first, ReadRankFile(dir, first_label));
  int tp = 0;
  int pp = 0;
  std::string source = "args";
  const std::optional<int64_t> args_tp = ArgNumber(first.facts.args, "tensor_model_parallel_size");
  const std::optional<int64_t> args_pp =
      ArgNumber(first.facts.args, "pipeline_model_parallel_size");
  if (args_tp.has_value() && args_pp.has_value()) {
    if (*args_tp < 1 || *args_pp < 1 || *args_tp * *args_pp > kMaxIndex) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": ", first.facts.name, " has args.tensor_model_parallel_size = ", *args_tp,
          " and args.pipeline_model_parallel_size = ", *args_pp));
    }
    tp = static_cast<int>(*args_tp);
    pp = static_cast<int>(*args_pp);
  } else {
    source = "folder names";
    for (const auto& [rank, name] : present) {
      tp = std::max(tp, rank.first + 1);
      pp = std::max(pp, rank.second + 1);
    }
  }
  const std::string what = absl::StrCat(dir, ": ", Topology("Megatron", tp, pp));

  // Every (tp, pp) folder, and no other.
  for (const auto& [rank, name] : present) {
    if (rank.first >= tp || rank.second >= pp) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " (from ", source, "): unexpected folder ", name));
    }
  }
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      const std::string expected = MegatronRankDirName(t, p, pp > 1);
      auto it = present.find({t, p});
      // With PP = 1 Megatron writes mp_rank_XX; accept mp_rank_XX_000 from other writers.
      if (it != present.end() && it->second != expected && pp > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": expected folder ", expected, ", found ", it->second));
      }
      const std::string name = it != present.end() ? it->second : expected;
      if (it == present.end() ||
          !fs::is_regular_file(JoinPath(JoinPath(dir, name), kRankFileName), error)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": ", name, "/", kRankFileName, " is missing"));
      }
    }
  }

  // Every file, checked against the first.
  std::vector<std::vector<RankFile>> files(tp);
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      const std::string& name = present.at({t, p});
      if (name == first_label) {
        files[t].push_back(std::move(first));
        continue;
      }
      ASSIGN_OR_RETURN(RankFile file, ReadRankFile(dir, name));
      files[t].push_back(std::move(file));
    }
  }
  const RankFile& reference = files[0][0];
  RETURN_IF_ERROR(CheckVersion(reference.facts, what, /*required=*/true));
  const size_t chunks = reference.chunks.size();
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      const RankFile& file = files[t][p];
      RETURN_IF_ERROR(CompareFacts(reference.facts, file.facts, what));
      if (file.chunks.size() != chunks) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", file.facts.name, " holds ",
                                                       file.chunks.size(), " model chunk(s) but ",
                                                       reference.facts.name, " holds ", chunks));
      }
    }
  }
  if (auto vpp = ArgNumber(reference.facts.args, "virtual_pipeline_model_parallel_size");
      vpp.has_value() && *vpp != static_cast<int64_t>(chunks) && !(chunks == 1 && *vpp <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": args.virtual_pipeline_model_parallel_size is ", *vpp,
                     " but the files hold ", chunks, " model chunk(s)"));
  }
  // A stage's tensor names agree across TP ranks.
  auto stage_name = [&](int t, int p, size_t v) {
    return chunks > 1 ? absl::StrCat(files[t][p].label, " model", v) : files[t][p].label;
  };
  for (size_t v = 0; v < chunks; ++v) {
    for (int p = 0; p < pp; ++p) {
      for (int t = 1; t < tp; ++t) {
        RETURN_IF_ERROR(CompareNames(files[0][p].chunks[v], stage_name(0, p, v),
                                     files[t][p].chunks[v], stage_name(t, p, v), what));
      }
    }
  }

  // Stages merged per TP rank; virtual stages interleave: chunk v of every PP rank, then v+1.
  StageMergeOptions merge_options;
  const std::optional<int64_t> num_layers = ArgNumber(reference.facts.args, "num_layers");
  merge_options.total_layers = num_layers;
  bool uneven = false;
  for (const char* key : kUnevenStageArgs) {
    if (auto value = ArgNumber(reference.facts.args, key); value.has_value() && *value != 0) {
      uneven = true;
    }
  }
  const int64_t stages = static_cast<int64_t>(pp) * static_cast<int64_t>(chunks);
  if (num_layers.has_value() && !uneven && *num_layers % stages == 0) {
    merge_options.layers_per_stage = *num_layers / stages;
  }
  InputModel model;
  model.format = MegatronInput::kId;
  model.layout = "model-parallel-parts";
  for (int t = 0; t < tp; ++t) {
    std::vector<PipelineStage> stage_list;
    std::vector<std::string> labels;
    for (size_t v = 0; v < chunks; ++v) {
      for (int p = 0; p < pp; ++p) {
        stage_list.push_back({stage_name(t, p, v), std::move(files[t][p].chunks[v])});
      }
    }
    for (int p = 0; p < pp; ++p) labels.push_back(files[t][p].label);
    auto merged = MergePipelineStages(std::move(stage_list), merge_options);
    if (!merged.ok()) return Annotate(merged.status(), what);
    std::vector<std::string> notes = files[t][0].notes;
    for (std::string& note : merged->other_entries) notes.push_back(std::move(note));
    merged->other_entries = std::move(notes);
    merged->format = MegatronInput::kId;
    model.parts.push_back(*std::move(merged));
    model.part_names.push_back(absl::StrCat("tp ", t, " (", absl::StrJoin(labels, ", "), ")"));
  }
  RETURN_IF_ERROR(CheckPaddedVocab(reference.facts, model.parts[0], tp, what));
  ASSIGN_OR_RETURN(const bool swiglu, DecideSwiGLU(reference.facts, model.parts[0], what));
  model.default_rules = MegatronPartitionRules(swiglu, QkvUnitRows(reference.facts.args));

  int64_t layers = 0;
  if (num_layers.has_value()) {
    layers = *num_layers;
  } else {
    std::set<std::string> seen;
    for (const CatalogTensor& tensor : model.parts[0].tensors) {
      const size_t at = tensor.name.find("layers.");
      if (at == std::string::npos) continue;
      seen.insert(tensor.name.substr(0, tensor.name.find('.', at + 7)));
    }
    layers = static_cast<int64_t>(seen.size());
  }
  std::string when = where.name;
  if (where.name != "release" && reference.facts.iteration.has_value()) {
    when = absl::StrCat("iteration ", *reference.facts.iteration);
  }
  model.description = absl::StrCat(Topology("Megatron-LM", tp, pp),
                                   chunks > 1 ? absl::StrCat(" x ", chunks, " virtual stages") : "",
                                   ", ", layers, " layers", swiglu ? ", SwiGLU" : "", ", ", when);
  return model;
}

// --------------------------------------------------------------------------- DeepSpeed pipe

std::string LayerFileName(int layer, int tp) {
  return absl::StrFormat("layer_%02d-model_%02d-model_states.pt", layer, tp);
}

absl::StatusOr<InputModel> ReadDeepSpeedPipe(const Resolved& where) {
  const std::string& dir = where.dir;
  std::map<int, std::map<int, std::string>> layer_files;  // layer -> tp -> file name
  std::map<int, std::string> state_files;                 // mp rank -> file name
  std::error_code error;
  for (fs::directory_iterator it(dir, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    std::error_code entry_error;
    if (!it->is_regular_file(entry_error)) continue;
    if (auto layer = ParsePipeLayerFile(name); layer.has_value()) {
      auto [slot, inserted] = layer_files[layer->layer].emplace(layer->tp, name);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": ", slot->second, " and ", name,
                                                       " are both layer ", layer->layer,
                                                       " of TP rank ", layer->tp));
      }
    } else if (absl::StartsWith(name, "layer_") && absl::StrContains(name, "_expert_")) {
      return absl::UnimplementedError(absl::StrCat(
          dir, ": ", name,
          " holds mixture-of-experts weights (layer_L_expert_E_mp_rank_XX files); DeepSpeed MoE "
          "checkpoints are not supported"));
    } else if (auto rank = ParseModelStatesFile(name); rank.has_value()) {
      state_files.emplace(*rank, name);
    }
  }
  if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing ", dir));
  if (layer_files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no pipeline layer files"));
  }

  // Args, iteration and version from the mp_rank files, which must agree.
  std::vector<FileFacts> facts;
  std::vector<std::string> notes;
  for (const auto& [rank, name] : state_files) {
    const std::string path = JoinPath(dir, name);
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(path));
    facts.push_back(ReadFacts(archive->root(), name));
    if (facts.size() == 1) {
      NoteTopLevel(archive->root(), {}, notes);
      for (std::string& note : notes) note = absl::StrCat(name, ": ", note);
    }
  }
  int tp = 0;
  for (const auto& [layer, ranks] : layer_files) tp = std::max(tp, ranks.rbegin()->first + 1);
  std::string what = absl::StrCat(dir, ": DeepSpeed pipeline");
  for (size_t i = 1; i < facts.size(); ++i) RETURN_IF_ERROR(CompareFacts(facts[0], facts[i], what));
  const FileFacts reference = facts.empty() ? FileFacts{} : facts[0];
  RETURN_IF_ERROR(CheckVersion(reference, what, /*required=*/false));
  std::optional<int64_t> pp;
  if (auto args_tp = ArgNumber(reference.args, "tensor_model_parallel_size"); args_tp.has_value()) {
    if (*args_tp < 1 || *args_tp > kMaxIndex) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", reference.name, " has args.tensor_model_parallel_size = ", *args_tp));
    }
    tp = static_cast<int>(*args_tp);
  }
  pp = ArgNumber(reference.args, "pipeline_model_parallel_size");
  if (!pp.has_value() && !state_files.empty() && state_files.size() % tp == 0) {
    pp = static_cast<int64_t>(state_files.size()) / tp;
  }
  what = absl::StrCat(dir, ": ",
                      pp ? Topology("DeepSpeed pipeline", tp, static_cast<int>(*pp))
                         : absl::StrCat("DeepSpeed pipeline TP", tp));

  // Every layer has a file for every TP rank, and for no other.
  for (const auto& [layer, ranks] : layer_files) {
    std::vector<int> held;
    for (const auto& [rank, name] : ranks) held.push_back(rank);
    for (const auto& [rank, name] : ranks) {
      if (rank >= tp) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": unexpected file ", name, " (TP rank ", rank, ")"));
      }
    }
    for (int t = 0; t < tp; ++t) {
      if (ranks.count(t) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": ", LayerFileName(layer, t), " is missing (layer ", layer,
                         " has files for TP rank(s) ", absl::StrJoin(held, ", "), ")"));
      }
    }
  }
  // One mp_rank file per (pp, tp) when the args say how many there are.
  if (pp.has_value() && !state_files.empty()) {
    const int64_t expected = *pp * tp;
    for (int64_t i = 0; i < expected && i < kMaxIndex; ++i) {
      if (state_files.count(static_cast<int>(i)) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", absl::StrFormat("mp_rank_%02d_model_states.pt", i), " is missing"));
      }
    }
    for (const auto& [rank, name] : state_files) {
      if (rank >= expected) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": unexpected file ", name));
      }
    }
  }

  // Each layer file of each TP rank, its tensors named "<layer>.<key>".
  std::vector<std::vector<Catalog>> layers(tp);  // [tp][layer position]
  std::vector<int> layer_ids;
  for (const auto& [layer, ranks] : layer_files) layer_ids.push_back(layer);
  for (int t = 0; t < tp; ++t) {
    for (int layer : layer_ids) {
      const std::string path = JoinPath(dir, layer_files[layer][t]);
      ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(path));
      ASSIGN_OR_RETURN(Catalog catalog,
                       StateDictCatalog(*archive, archive->root(), absl::StrCat(layer)));
      if (t == 0) {
        for (std::string& note : catalog.other_entries) notes.push_back(std::move(note));
      }
      catalog.other_entries.clear();
      layers[t].push_back(std::move(catalog));
    }
  }
  for (int t = 1; t < tp; ++t) {
    for (size_t i = 0; i < layer_ids.size(); ++i) {
      RETURN_IF_ERROR(CompareNames(layers[0][i], LayerFileName(layer_ids[i], 0), layers[t][i],
                                   LayerFileName(layer_ids[i], t), what));
    }
  }

  // The tied embedding (TiedLayerSpec 'embed') has a layer file at each end: keep the first.
  // A later layer is that copy when it holds exactly the same keys, dtypes and shapes as the
  // first layer holding word_embeddings.weight.
  auto signature = [](const Catalog& catalog, int layer) {
    std::vector<std::string> keys;
    const std::string prefix = absl::StrCat(layer, ".");
    for (const CatalogTensor& tensor : catalog.tensors) {
      keys.push_back(absl::StrCat(absl::StripPrefix(tensor.name, prefix), " ",
                                  DTypeName(tensor.dtype), " ", ShapeToString(tensor.shape)));
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  };
  std::vector<bool> dropped(layer_ids.size(), false);
  std::optional<size_t> embedding;
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    const Catalog& catalog = layers[0][i];
    if (catalog.Find(absl::StrCat(layer_ids[i], ".word_embeddings.weight")) < 0) continue;
    if (!embedding.has_value()) {
      embedding = i;
      continue;
    }
    if (signature(catalog, layer_ids[i]) ==
        signature(layers[0][*embedding], layer_ids[*embedding])) {
      dropped[i] = true;
      notes.push_back(
          absl::StrCat(layer_ids[i], ".*: the second instance of the tied embedding layer (",
                       LayerFileName(layer_ids[i], 0), ", ...), left out: ", layer_ids[*embedding],
                       ".* holds the embedding"));
    }
  }

  InputModel model;
  model.format = MegatronInput::kId;
  model.layout = "model-parallel-parts";
  for (int t = 0; t < tp; ++t) {
    Catalog part;
    part.format = MegatronInput::kId;
    for (size_t i = 0; i < layer_ids.size(); ++i) {
      if (dropped[i]) continue;
      AppendCatalog(part, std::move(layers[t][i]));
    }
    part.other_entries = notes;
    part.Reindex();
    model.parts.push_back(std::move(part));
    model.part_names.push_back(absl::StrFormat("tp %d (layer_*-model_%02d-model_states.pt)", t, t));
  }
  RETURN_IF_ERROR(CheckPaddedVocab(reference, model.parts[0], tp, what));
  ASSIGN_OR_RETURN(const bool swiglu, DecideSwiGLU(reference, model.parts[0], what));
  model.default_rules = MegatronPartitionRules(swiglu, QkvUnitRows(reference.args));

  std::string when = absl::StrCat("tag ", where.name);
  if (reference.iteration.has_value()) {
    when = absl::StrCat("iteration ", *reference.iteration, ", ", when);
  }
  const std::optional<int64_t> num_layers = ArgNumber(reference.args, "num_layers");
  model.description = absl::StrCat(
      "Megatron-DeepSpeed pipeline ",
      pp ? absl::StrCat("TP", tp, " x PP", *pp) : absl::StrCat("TP", tp), ", ",
      num_layers ? absl::StrCat(*num_layers, " layers in ") : "", layer_ids.size(), " layer files",
      swiglu ? ", SwiGLU" : "", ", ", when,
      facts.empty() ? " (no mp_rank_XX_model_states.pt: topology from the layer files)" : "");
  return model;
}

// --------------------------------------------------------------------------- stage merge

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
    const std::optional<int> index = ParseIndex(parts[i + 1]);
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
         absl::EndsWith(prefix, "transformer.layers");
}

}  // namespace

// --------------------------------------------------------------------------- public pieces

std::optional<MegatronRankDir> ParseMegatronRankDir(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "mp_rank_")) return std::nullopt;
  std::vector<absl::string_view> fields = absl::StrSplit(name, '_');
  if (fields.empty() || fields.size() > 3) return std::nullopt;
  std::vector<int> numbers;
  for (absl::string_view field : fields) {
    const std::optional<int> number = ParseIndex(field);
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

std::string MegatronRankDirName(int tp, int pp, bool has_pp) {
  return has_pp ? absl::StrFormat("mp_rank_%02d_%03d", tp, pp)
                : absl::StrFormat("mp_rank_%02d", tp);
}

std::optional<PipeLayerFile> ParsePipeLayerFile(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "layer_") || !absl::ConsumeSuffix(&name, "-model_states.pt")) {
    return std::nullopt;
  }
  const size_t dash = name.find("-model_");
  if (dash == absl::string_view::npos) return std::nullopt;
  const std::optional<int> layer = ParseIndex(name.substr(0, dash));
  const std::optional<int> tp = ParseIndex(name.substr(dash + 7));
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

absl::StatusOr<Catalog> MergePipelineStages(std::vector<PipelineStage> stages,
                                            const StageMergeOptions& options) {
  Catalog merged;
  merged.format = MegatronInput::kId;
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
      if (tensor.name == kHeadCopyName ||
          absl::EndsWith(tensor.name, absl::StrCat(".", kHeadCopyName))) {
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
  constexpr absl::string_view kUp = "mlp.dense_h_to_4h.weight";
  constexpr absl::string_view kDown = "mlp.dense_4h_to_h.weight";
  for (const CatalogTensor& tensor : catalog.tensors) {
    if (!absl::EndsWith(tensor.name, kUp)) continue;
    const std::string down =
        absl::StrCat(tensor.name.substr(0, tensor.name.size() - kUp.size()), kDown);
    const int found = catalog.Find(down);
    if (found < 0) continue;
    const Shape& up_shape = tensor.shape;
    const Shape& down_shape = catalog.tensors[found].shape;
    if (up_shape.size() != 2 || down_shape.size() != 2) continue;
    return up_shape[0] == 2 * down_shape[1];
  }
  return std::nullopt;
}

std::vector<PartitionRule> MegatronPresetRules() {
  auto split = [](std::string pattern, int dim) { return PartitionRule{std::move(pattern), false, dim}; };
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
  };
}

std::vector<PartitionRule> MegatronPartitionRules(bool swiglu, int64_t qkv_unit_rows) {
  std::vector<PartitionRule> rules = MegatronPresetRules();
  if (swiglu) {
    rules.insert(rules.begin(), PartitionRule{"dense_h_to_4h\\.(weight|bias)$", false, 0, 2});
  }
  if (qkv_unit_rows > 1) {
    rules.insert(rules.begin(),
                 PartitionRule{"query_key_value\\.(weight|bias)$", false, 0, 1, qkv_unit_rows});
  }
  return rules;
}

bool MegatronInput::Probe(const std::string& path) const {
  if (ResolveCheckpoint(path, "").ok()) return true;
  // Megatron save folders with something wrong in them are claimed too, so that Read can say
  // what (or --tag can pick a folder): iter_* / release checkpoints but no tracker; a tracker
  // naming a folder that is missing. A folder a tracker names that holds neither rank folders
  // nor layer files (Megatron's torch_dist format) is left to other readers, and so is a folder
  // beside DeepSpeed's `latest` that is no pipeline checkpoint (the ZeRO reader's).
  std::error_code error;
  if (!fs::is_directory(path, error) || fs::exists(JoinPath(path, kDeepSpeedTrackerName), error)) {
    return false;
  }
  if (!CheckpointSubfolders(path).empty()) return true;
  // A tracker that cannot be read (or is too large) claims nothing here.
  const absl::StatusOr<std::optional<std::string>> tracker =
      ReadTrackerFile(JoinPath(path, kMegatronTrackerName));
  if (!tracker.ok() || !tracker->has_value()) return false;
  const std::optional<std::string> name = IterationFolderFromTracker(**tracker);
  return name.has_value() && !fs::exists(JoinPath(path, *name), error);
}

absl::StatusOr<InputModel> MegatronInput::Read(const std::string& path,
                                               const ReadOptions& options) const {
  ASSIGN_OR_RETURN(Resolved where, ResolveCheckpoint(path, options.tag));
  if (where.layout == Layout::kDeepSpeedPipe) return ReadDeepSpeedPipe(where);
  return ReadMegatronLM(where);
}

namespace {
const InputFormatRegistration<MegatronInput> register_input;
const PartitionRulePresetRegistration register_preset("megatron", MegatronPresetRules());
}  // namespace

}  // namespace reshard
