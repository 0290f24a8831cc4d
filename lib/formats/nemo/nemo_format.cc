#include "lib/formats/nemo/nemo_format.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/hf/sentencepiece_model.h"
#include "lib/formats/megatron/megatron_facts.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/formats/megatron/torch_dist_format.h"
#include "lib/formats/nemo/nemo_io_json.h"
#include "lib/formats/nemo/tar_archive.h"
#include "lib/formats/nemo/tar_store.h"
#include "lib/formats/nemo/yaml_subset.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/byte_source.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"
#include "nlohmann/json.hpp"

namespace reshard {

namespace {

constexpr char kConfigMember[] = "model_config.yaml";
constexpr char kWeightsMember[] = "model_weights.ckpt";
constexpr char kDistFolder[] = "model_weights";
constexpr uint64_t kMaxConfigBytes = 16 << 20;
constexpr size_t kTarMagicOffset = 257;

// The Catalog of the state dict in ckpt member `member`: a torch.save archive parsed through a
// slice of the archive, its tensors pieces of the archive file itself.
absl::StatusOr<Catalog> ReadCkptMember(const MountedTar& archive, const TarMember& member) {
  const TarArchive& tar = archive.tar();
  SliceByteSource slice(archive.source(), member.data_offset, member.size, tar.Describe(member));
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> torch, TorchArchive::Parse(slice));
  const PickleValue* root = torch->root();
  if (PickleEntries(root) == nullptr) {
    return absl::DataLossError(absl::StrCat(tar.Describe(member), ": expected a state dict, found ",
                                            DescribePickleValue(root)));
  }
  ASSIGN_OR_RETURN(Catalog catalog, megatron_internal::StateDictCatalog(*torch, root, ""));
  catalog.format = NemoInput::kId;
  catalog.files = {SourceFile{tar.path(), tar.size(), torch->ChecksummedRanges(member.data_offset),
                              archive.file().version()}};
  for (CatalogTensor& tensor : catalog.tensors) {
    for (SourcePiece& piece : tensor.pieces) piece.byte_offset += member.data_offset;
    for (SourcePiece& piece : tensor.replicas) piece.byte_offset += member.data_offset;
  }
  return catalog;
}

// A config's scalars as Megatron's args (NeMo's config keys are Megatron's arg names), for
// `--format hf` (hf_config.h reads "megatron.args"): ints, floats, booleans, null and strings as
// such; nested mappings and sequences left out. Megatron's group_query_attention, swiglu and
// max_position_embeddings, which NeMo spells otherwise, are derived from num_query_groups,
// activation or gated_linear_unit (NeMo 2; swiglu left out when neither is given), and
// seq_length (NeMo 2).
StructureNode ConfigAsArgs(const YamlNode& config) {
  StructureNode args;
  args.kind = StructureNode::Kind::kDict;
  auto add = [&](const std::string& key, StructureNode value) {
    args.keys.push_back(StructureNode::String(key));
    args.values.push_back(std::move(value));
  };
  for (const auto& [key, node] : config.map) {
    if (node.kind == YamlNode::Kind::kNull) {
      add(key, StructureNode());
      continue;
    }
    if (node.kind != YamlNode::Kind::kScalar) continue;
    if (std::optional<int64_t> integer = YamlInt(&node)) {
      add(key, StructureNode::Int(*integer));
    } else if (std::optional<bool> boolean = YamlBool(&node)) {
      add(key, StructureNode::Bool(*boolean));
    } else if (double real = 0; absl::SimpleAtod(node.scalar, &real) &&
                                node.scalar.find_first_of(".eE") != std::string::npos) {
      StructureNode value;
      value.kind = StructureNode::Kind::kFloat;
      value.real = real;
      add(key, value);
    } else {
      add(key, StructureNode::String(node.scalar));
    }
  }
  const std::optional<int64_t> heads = YamlInt(config.Get("num_attention_heads"));
  const std::optional<int64_t> groups = YamlInt(config.Get("num_query_groups"));
  if (config.Get("group_query_attention") == nullptr) {
    add("group_query_attention",
        StructureNode::Bool(groups.has_value() && heads.has_value() && *groups != *heads));
  }
  // Only when the config says which MLP it is (a NeMo 2 dataclass's defaults are not written).
  if (config.Get("swiglu") == nullptr &&
      (config.Get("activation") != nullptr || config.Get("gated_linear_unit") != nullptr)) {
    const std::optional<std::string> activation = YamlString(config.Get("activation"));
    add("swiglu", StructureNode::Bool(
                      (activation.has_value() && absl::StrContains(*activation, "swiglu")) ||
                      YamlBool(config.Get("gated_linear_unit")).value_or(false)));
  }
  // NeMo 2's GPTConfig says seq_length.
  if (config.Get("max_position_embeddings") == nullptr) {
    if (std::optional<int64_t> length = YamlInt(config.Get("seq_length"))) {
      add("max_position_embeddings", StructureNode::Int(*length));
    }
  }
  // Llama 3.1's rope scaling: NeMo 1 says scale_positional_embedding (Megatron-Core's
  // rope_scaling, factor rope_scaling_factor or 8), NeMo 2's Llama31Config a scale_factor.
  if (config.Get("use_rope_scaling") == nullptr) {
    const std::optional<bool> nemo1 = YamlBool(config.Get("scale_positional_embedding"));
    const YamlNode* scale_factor = config.Get("scale_factor");
    const bool scaled = nemo1.value_or(false) ||
                        (scale_factor != nullptr && scale_factor->kind == YamlNode::Kind::kScalar);
    add("use_rope_scaling", StructureNode::Bool(scaled));
    if (double factor = 0; scaled && config.Get("rope_scaling_factor") == nullptr &&
                           scale_factor != nullptr &&
                           absl::SimpleAtod(scale_factor->scalar, &factor)) {
      StructureNode value;
      value.kind = StructureNode::Kind::kFloat;
      value.real = factor;
      add("rope_scaling_factor", value);
    }
  }
  return args;
}

// Sets args.vocab_size = `size` unless the args give one (a null one, NeMo 2's GPTConfig
// default, gives none).
void AddVocabSize(StructureNode& args, int64_t size) {
  for (size_t i = 0; i < args.keys.size(); ++i) {
    const StructureNode& key = args.keys[i];
    if (key.kind != StructureNode::Kind::kString || key.text != "vocab_size") continue;
    if (args.values[i].kind == StructureNode::Kind::kNone) {
      args.values[i] = StructureNode::Int(size);
    }
    return;
  }
  args.keys.push_back(StructureNode::String("vocab_size"));
  args.values.push_back(StructureNode::Int(size));
}

// The tokenizer files model_config.yaml's `tokenizer` section names inside the archive, as
// NeMo's register_artifact records them ("nemo:<hash>_<name>"), with the Hugging Face name
// each takes: `model` (a SentencePiece model) tokenizer.model; `vocab_file` tokenizer.json
// when it is one, else vocab.json (a BPE vocabulary) or vocab.txt (a WordPiece one, *.txt or
// *.vocab); `merge_file` merges.txt. Entries naming files outside the archive (a path on the
// training machine, null) are not carried.
struct TokenizerMember {
  std::string key;      // "tokenizer.model"
  std::string hf_name;  // "tokenizer.model"
  const TarMember* member = nullptr;
};

std::string TokenizerHfName(absl::string_view key, absl::string_view name) {
  if (key == "model") return "tokenizer.model";
  if (key == "merge_file") return "merges.txt";
  if (absl::EndsWith(name, "tokenizer.json")) return "tokenizer.json";
  return absl::EndsWith(name, ".json") ? "vocab.json" : "vocab.txt";
}

absl::StatusOr<std::vector<TokenizerMember>> FindTokenizerMembers(const TarArchive& tar,
                                                                  const YamlNode& root) {
  std::vector<TokenizerMember> found;
  const YamlNode* tokenizer = root.Get("tokenizer");
  if (tokenizer == nullptr || tokenizer->kind != YamlNode::Kind::kMap) return found;
  for (const char* key : {"model", "vocab_file", "merge_file"}) {
    const std::string value = YamlString(tokenizer->Get(key)).value_or("");
    absl::string_view name = value;
    if (!absl::ConsumePrefix(&name, "nemo:")) continue;
    const std::string where = absl::StrCat(tar.path(), ": ", kConfigMember, ": tokenizer.", key,
                                           " \"", value, "\"");
    if (name.empty() || name == "." || name == ".." || absl::StrContains(name, "/") ||
        absl::StrContains(name, "\\")) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " names no member at the archive's root: a tokenizer file NeMo registers is a "
                 "member beside ", kConfigMember, ", never outside the archive"));
    }
    const TarMember* member = tar.Find(name);
    if (member == nullptr) {
      return absl::DataLossError(
          absl::StrCat(where, ": the archive has no member ", name, " (an incomplete archive)"));
    }
    if (member->kind != TarMember::Kind::kFile) {
      return absl::DataLossError(
          absl::StrCat(where, ": member ", name, " is not a regular file"));
    }
    found.push_back({absl::StrCat("tokenizer.", key), TokenizerHfName(key, name), member});
  }
  return found;
}

// The vocabulary size a tokenizer file gives: a SentencePiece tokenizer.model's pieces, a
// vocab.json's entries; nullopt for other files or ones that do not parse.
std::optional<int64_t> TokenizerVocabSize(absl::string_view hf_name, absl::string_view bytes) {
  if (hf_name == "tokenizer.model") {
    const absl::StatusOr<SentencePieceModel> model = ParseSentencePieceModel(bytes, hf_name);
    if (!model.ok()) return std::nullopt;
    return model->pieces;
  }
  if (hf_name != "vocab.json") return std::nullopt;
  const nlohmann::json vocab = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (!vocab.is_object()) return std::nullopt;
  return static_cast<int64_t>(vocab.size());
}

// What model_config.yaml says.
struct NemoConfig {
  int tp = 1;
  int pp = 1;
  std::optional<int64_t> num_layers;
  std::optional<bool> swiglu;  // from `activation`
  int64_t qkv_unit_rows = 1;
  StructureNode args;  // ConfigAsArgs
  std::vector<TokenizerMember> tokenizer;  // FindTokenizerMembers
};

absl::StatusOr<NemoConfig> ReadConfig(const MountedTar& archive) {
  const TarArchive& tar = archive.tar();
  absl::StatusOr<const TarMember*> member = tar.File(kConfigMember);
  if (!member.ok()) {
    if (absl::IsNotFound(member.status())) {
      return absl::DataLossError(absl::StrCat(
          tar.path(), ": no ", kConfigMember, " member: not a NeMo 1 archive, or an incomplete one"));
    }
    return member.status();
  }
  if ((*member)->size > kMaxConfigBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(tar.Describe(**member), " has ",
                                                     (*member)->size, " bytes (at most ",
                                                     kMaxConfigBytes, ")"));
  }
  ASSIGN_OR_RETURN(absl::string_view text,
                   archive.source().Read((*member)->data_offset, (*member)->size, kConfigMember));
  ASSIGN_OR_RETURN(const YamlNode root, ParseYamlSubset(text, tar.Describe(**member)));
  if (root.kind != YamlNode::Kind::kMap) {
    return absl::DataLossError(absl::StrCat(tar.Describe(**member), ": not a mapping"));
  }
  NemoConfig config;
  for (auto [key, slot] : {std::pair<const char*, int*>{"tensor_model_parallel_size", &config.tp},
                           {"pipeline_model_parallel_size", &config.pp}}) {
    const YamlNode* node = root.Get(key);
    if (node == nullptr || node->kind == YamlNode::Kind::kNull) continue;
    const std::optional<int64_t> value = YamlInt(node);
    if (!value.has_value() || *value < 1 || *value > kMaxMegatronIndex) {
      return absl::DataLossError(absl::StrCat(tar.Describe(**member), ": ", key, " is \"",
                                              node->scalar, "\", not a positive integer"));
    }
    *slot = static_cast<int>(*value);
  }
  if (static_cast<int64_t>(config.tp) * config.pp > kMaxMegatronIndex) {
    return absl::DataLossError(absl::StrCat(tar.Describe(**member), ": TP ", config.tp, " x PP ",
                                            config.pp, " is not a real topology"));
  }
  config.args = ConfigAsArgs(root);
  ASSIGN_OR_RETURN(config.tokenizer, FindTokenizerMembers(tar, root));
  config.num_layers = YamlInt(root.Get("num_layers"));
  if (std::optional<std::string> activation = YamlString(root.Get("activation"))) {
    config.swiglu = absl::StrContains(*activation, "swiglu");
  }
  const std::optional<int64_t> heads = YamlInt(root.Get("num_attention_heads"));
  const std::optional<int64_t> hidden = YamlInt(root.Get("hidden_size"));
  std::optional<int64_t> groups = YamlInt(root.Get("num_query_groups"));
  std::optional<int64_t> head_dim = YamlInt(root.Get("kv_channels"));
  if (heads.has_value() && *heads > 0) {
    if (!groups.has_value()) groups = heads;
    if (!head_dim.has_value() && hidden.has_value()) head_dim = *hidden / *heads;
    if (*groups > 0 && *heads % *groups == 0 && head_dim.has_value() && *head_dim > 0 &&
        *head_dim < (1 << 20) && *heads / *groups < (1 << 20)) {
      config.qkv_unit_rows = (*heads / *groups + 2) * *head_dim;
    }
  }
  return config;
}

// A per-rank folder: "mp_rank_01" (PP = 1) or "tp_rank_01_pp_rank_002".
struct RankFolder {
  int tp = 0;
  int pp = 0;
  bool has_pp = false;
};

std::optional<RankFolder> ParseRankFolder(absl::string_view name) {
  RankFolder rank;
  if (absl::ConsumePrefix(&name, "mp_rank_")) {
    const std::optional<int> tp = ParseMegatronIndex(name);
    if (!tp.has_value()) return std::nullopt;
    rank.tp = *tp;
    return rank;
  }
  if (!absl::ConsumePrefix(&name, "tp_rank_")) return std::nullopt;
  const size_t at = name.find("_pp_rank_");
  if (at == absl::string_view::npos) return std::nullopt;
  const std::optional<int> tp = ParseMegatronIndex(name.substr(0, at));
  const std::optional<int> pp = ParseMegatronIndex(name.substr(at + 9));
  if (!tp.has_value() || !pp.has_value()) return std::nullopt;
  rank.tp = *tp;
  rank.pp = *pp;
  rank.has_pp = true;
  return rank;
}

// The folder NeMo names for rank (tp, pp) of a TP x PP model (NLPSaveRestoreConnector).
std::string RankFolderName(int tp, int pp, int pp_size) {
  return pp_size == 1 ? absl::StrFormat("mp_rank_%02d", tp)
                      : absl::StrFormat("tp_rank_%02d_pp_rank_%03d", tp, pp);
}

// Distinct layers of the merged model (`<prefix>layers.<i>`).
int64_t CountLayers(const Catalog& catalog) {
  std::set<std::string> seen;
  for (const CatalogTensor& tensor : catalog.tensors) {
    const size_t at = tensor.name.find("layers.");
    if (at == std::string::npos) continue;
    seen.insert(tensor.name.substr(0, tensor.name.find('.', at + 7)));
  }
  return static_cast<int64_t>(seen.size());
}

// Whether the model's MLP is SwiGLU from its shapes: a first fc1 twice as tall as its fc2 is
// wide (Megatron-Core or legacy names).
std::optional<bool> SwiGLUFromNemoShapes(const Catalog& catalog) {
  return SwiGLUFromShapes(catalog);
}

// The tokenizer and other files of the archive besides config and weights, hash prefixes
// stripped.
std::vector<std::string> ArtifactFiles(const TarArchive& tar) {
  std::vector<std::string> names;
  for (const TarMember& member : tar.members()) {
    if (member.kind != TarMember::Kind::kFile || member.name == kConfigMember ||
        absl::EndsWith(member.name, kWeightsMember) ||
        absl::StartsWith(member.name, absl::StrCat(kDistFolder, "/"))) {
      continue;
    }
    names.push_back(StripArtifactHash(member.name));
  }
  return names;
}

// Places a catalog read through the archive's tar:// paths onto the archive file itself: one
// SourceFile, the archive, with every piece and checksummed range at its member's data offset.
// The conversion then reads the archive through its own driver (a local one mapped), and
// needs no mount.
absl::Status PlaceOnArchive(const MountedTar& archive, Catalog& catalog) {
  if (catalog.files.empty()) return absl::OkStatus();
  SourceFile placed{archive.tar().path(), archive.tar().size(), {}, archive.file().version()};
  std::vector<uint64_t> base;
  for (const SourceFile& file : catalog.files) {
    ASSIGN_OR_RETURN(const std::string name, archive.MemberOf(file.path));
    ASSIGN_OR_RETURN(const TarMember* member, archive.tar().File(name));
    base.push_back(member->data_offset);
    for (ChecksummedRange range : file.checksummed) {
      range.offset += member->data_offset;
      range.name = absl::StrCat(archive.tar().Describe(*member), " ", range.name);
      placed.checksummed.push_back(std::move(range));
    }
  }
  for (CatalogTensor& tensor : catalog.tensors) {
    for (std::vector<SourcePiece>* pieces : {&tensor.pieces, &tensor.replicas}) {
      for (SourcePiece& piece : *pieces) {
        piece.byte_offset += base[piece.file];
        piece.file = 0;
      }
    }
  }
  catalog.files = {std::move(placed)};
  return absl::OkStatus();
}

// Refuses a Zarr-backend distributed checkpoint (metadata.json's sharded_backend).
absl::Status RefuseZarr(const MountedTar& archive) {
  const TarArchive& tar = archive.tar();
  const TarMember* metadata = tar.Find(absl::StrCat(kDistFolder, "/", kTorchDistMetadataName));
  if (metadata == nullptr || metadata->kind != TarMember::Kind::kFile ||
      metadata->size > kMaxConfigBytes) {
    return absl::OkStatus();  // the torch_dist reader names what is wrong
  }
  ASSIGN_OR_RETURN(
      absl::string_view text,
      archive.source().Read(metadata->data_offset, metadata->size, kTorchDistMetadataName));
  if (!absl::StrContains(text, "zarr")) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      tar.Describe(*metadata),
      ": a Zarr-backend distributed checkpoint, which reshard does not read: Megatron-Core "
      "deprecated the backend, and no description of its layout (array metadata, chunk keys, "
      "compressors per tensor) is precise enough to test a reader against; load it in NeMo and "
      "save it again with dist_ckpt_format: torch_dist"));
}

absl::StatusOr<InputModel> ReadNemo1(const std::string& path, const ReadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<MountedTar> mount, MountedTar::Mount(path));
  const MountedTar& archive = *mount;
  const TarArchive& tar = archive.tar();
  // Which layout: the root ckpt, per-rank ckpts, or a distributed checkpoint folder.
  const TarMember* single = tar.Find(kWeightsMember);
  std::map<std::pair<int, int>, const TarMember*> ranks;
  bool distributed = false;
  for (const TarMember& member : tar.members()) {
    if (absl::StartsWith(member.name, absl::StrCat(kDistFolder, "/"))) distributed = true;
    const size_t slash = member.name.find('/');
    if (slash == std::string::npos || member.name.substr(slash + 1) != kWeightsMember) continue;
    const std::optional<RankFolder> rank = ParseRankFolder(member.name.substr(0, slash));
    if (!rank.has_value()) continue;
    auto [slot, inserted] = ranks.emplace(std::make_pair(rank->tp, rank->pp), &member);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": members ", slot->second->name,
                                                     " and ", member.name, " are both TP rank ",
                                                     rank->tp, ", PP rank ", rank->pp));
    }
  }
  const int layouts = (single != nullptr) + !ranks.empty() + distributed;
  if (layouts == 0 && tar.Find(kConfigMember) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": a tar archive, but not a NeMo 1 archive (neither ", kConfigMember,
        " nor weights in it)"));
  }
  if (layouts == 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": a tar archive without NeMo weights (no ", kWeightsMember, ", mp_rank_XX/",
        kWeightsMember, ", tp_rank_XX_pp_rank_XXX/", kWeightsMember, " or ", kDistFolder,
        "/ member)"));
  }
  if (layouts > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": holds weights in more than one layout (", kWeightsMember, ", per-rank ",
        kWeightsMember, ", ", kDistFolder, "/): which one is the model is not clear"));
  }
  ASSIGN_OR_RETURN(NemoConfig config, ReadConfig(archive));
  const std::string what =
      absl::StrCat(path, ": ", megatron_internal::Topology("NeMo 1", config.tp, config.pp),
                   " (", kConfigMember, ")");

  InputModel model;
  model.format = NemoInput::kId;
  std::string layout;
  if (distributed) {
    RETURN_IF_ERROR(RefuseZarr(archive));
    ASSIGN_OR_RETURN(model, TorchDistInput().Read(archive.PathOf(kDistFolder), options),
                     absl::StrCat(what, ": ", kDistFolder, "/"));
    for (Catalog& part : model.parts) {
      RETURN_IF_ERROR(PlaceOnArchive(archive, part), absl::StrCat(what, ": ", kDistFolder, "/"));
      part.format = NemoInput::kId;
    }
    model.format = NemoInput::kId;
  } else if (single != nullptr) {
    if (config.tp * config.pp != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the archive holds one ", kWeightsMember, ", not one per rank"));
    }
    ASSIGN_OR_RETURN(const TarMember* member, tar.File(kWeightsMember));
    ASSIGN_OR_RETURN(Catalog catalog, ReadCkptMember(archive, *member));
    model.arrangement = "single-file";
    model.parts.push_back(std::move(catalog));
    model.part_names.push_back(member->name);
    layout = absl::StrCat("one ", kWeightsMember);
  } else {
    // Every rank's member, and no other.
    for (const auto& [rank, member] : ranks) {
      if (rank.first >= config.tp || rank.second >= config.pp ||
          member->name != absl::StrCat(RankFolderName(rank.first, rank.second, config.pp), "/",
                                       kWeightsMember)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": unexpected member ", member->name));
      }
    }
    std::vector<std::vector<PipelineStage>> stages(config.tp);
    std::vector<std::vector<ChecksummedRange>> checksummed(config.tp);
    // The members parsed several at once (from S3 each is range reads of the archive; its
    // source's reads are safe concurrently), taken in (tp, pp) order.
    RETURN_IF_ERROR(ReadInOrder<Catalog>(
        config.tp * config.pp, ParallelReadOptions(),
        [&](int i) -> absl::StatusOr<Catalog> {
          const int t = i / config.pp, p = i % config.pp;
          auto it = ranks.find({t, p});
          if (it == ranks.end()) {
            return absl::DataLossError(absl::StrCat(what, ": member ",
                                                    RankFolderName(t, p, config.pp), "/",
                                                    kWeightsMember, " is missing"));
          }
          ASSIGN_OR_RETURN(const TarMember* member, tar.File(it->second->name));
          return ReadCkptMember(archive, *member);
        },
        [](const Catalog& catalog) { return CatalogBytes(catalog); },
        [&](int i, Catalog catalog) {
          const int t = i / config.pp, p = i % config.pp;
          for (const ChecksummedRange& range : catalog.files[0].checksummed) {
            checksummed[t].push_back(range);
          }
          stages[t].push_back({RankFolderName(t, p, config.pp), std::move(catalog)});
          return absl::OkStatus();
        }));
    for (int t = 1; t < config.tp; ++t) {
      for (int p = 0; p < config.pp; ++p) {
        RETURN_IF_ERROR(megatron_internal::CompareNames(stages[0][p].catalog, stages[0][p].name,
                                                        stages[t][p].catalog, stages[t][p].name,
                                                        what));
      }
    }
    for (int t = 0; t < config.tp; ++t) {
      std::vector<std::string> labels;
      for (const auto& stage : stages[t]) labels.push_back(stage.name);
      ASSIGN_OR_RETURN(Catalog merged, MergePipelineStages(std::move(stages[t]), {}), what);
      // Every stage's member is a range of the one archive file: its checksummed ranges are all
      // of theirs.
      merged.files[0].checksummed = std::move(checksummed[t]);
      merged.format = NemoInput::kId;
      model.parts.push_back(std::move(merged));
      model.part_names.push_back(absl::StrCat("tp ", t, " (", absl::StrJoin(labels, ", "), ")"));
    }
    model.arrangement = "model-parallel-parts";
    layout = absl::StrCat(kWeightsMember, " per rank");
  }
  const int64_t layers = CountLayers(model.parts[0]);
  if (config.num_layers.has_value() && *config.num_layers != layers) {
    return absl::DataLossError(absl::StrCat(what, ": the weights hold ", layers,
                                            " layers, but num_layers is ", *config.num_layers));
  }
  bool swiglu = config.swiglu.value_or(false);
  if (!config.swiglu.has_value()) swiglu = SwiGLUFromNemoShapes(model.parts[0]).value_or(false);
  model.default_rules = NemoPartitionRules(swiglu, config.qkv_unit_rows);
  // The torch_dist reader's own description of the folder goes last.
  const std::string dist_description = distributed ? model.description : "";
  model.description = absl::StrCat(
      distributed ? absl::StrCat("NeMo 1 archive, torch_dist weights (", kDistFolder, "/), TP",
                                 config.tp, " x PP", config.pp)
                  : absl::StrCat("NeMo 1 archive, TP", config.tp, " x PP", config.pp, ", ", layout),
      ", ", layers, layers == 1 ? " layer" : " layers", swiglu ? ", SwiGLU" : "");
  const std::vector<std::string> artifacts = ArtifactFiles(tar);
  if (!artifacts.empty()) {
    absl::StrAppend(&model.description, "; tokenizer and other files: ",
                    absl::StrJoin(artifacts, ", "));
  }
  if (distributed) absl::StrAppend(&model.description, "; ", dist_description);
  // The tokenizer members, carried by --format hf under their Hugging Face names; the first
  // that gives a vocabulary size is the true vocabulary (padded rows past it dropped).
  std::optional<int64_t> vocab_size;
  for (const TokenizerMember& file : config.tokenizer) {
    model.model_files.push_back({file.hf_name, tar.path(), file.member->data_offset,
                                 file.member->size, file.member->name});
    if (vocab_size.has_value() || file.member->size > kMaxConfigBytes) continue;
    ASSIGN_OR_RETURN(const absl::string_view bytes,
                     archive.source().Read(file.member->data_offset, file.member->size,
                                           tar.Describe(*file.member)));
    vocab_size = TokenizerVocabSize(file.hf_name, bytes);
  }
  if (vocab_size.has_value()) AddVocabSize(config.args, *vocab_size);
  model.training_state.values["megatron.args"] = std::move(config.args);
  // Only metadata pages were touched; give them back before any conversion runs.
  archive.file().Release(0, archive.file().size());
  return model;
}

absl::StatusOr<InputModel> ReadNemo2(const std::string& path, const ReadOptions& options) {
  const std::string weights = JoinPath(path, "weights");
  ASSIGN_OR_RETURN(InputModel model, TorchDistInput().Read(weights, options),
                   absl::StrCat(path, ": NeMo 2 folder"));
  model.format = NemoInput::kId;
  for (Catalog& part : model.parts) part.format = NemoInput::kId;
  std::vector<std::string> tokenizer;
  const std::string tokenizer_dir = JoinPath(JoinPath(path, "context"), "nemo_tokenizer");
  ASSIGN_OR_RETURN(const bool has_tokenizer, CheckInputFolder(tokenizer_dir));
  if (has_tokenizer) {
    ASSIGN_OR_RETURN(InputListing listing, ListInput(tokenizer_dir));
    tokenizer = listing.files;
  }
  // The model's config for `--format hf`: context/model.yaml's `config` mapping when it is YAML
  // this reader reads, else context/io.json's (fiddle's serialization of the same dataclass);
  // otherwise --config gives the config.
  const std::string context = JoinPath(path, "context");
  std::optional<YamlNode> config;
  std::string no_config;  // why neither gave one
  const std::string model_yaml = JoinPath(context, "model.yaml");
  ASSIGN_OR_RETURN(const bool has_model_yaml, CheckInputFile(model_yaml));
  if (has_model_yaml) {
    ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(model_yaml, kMaxConfigBytes));
    absl::StatusOr<YamlNode> root = ParseYamlSubset(text, model_yaml);
    const YamlNode* found = root.ok() ? root->Get("config") : nullptr;
    if (found != nullptr && found->kind == YamlNode::Kind::kMap) {
      config = *found;
    } else {
      no_config = absl::StrCat("context/model.yaml: no model config read (",
                               root.ok() ? "no `config` mapping" : root.status().message(), ")");
    }
  }
  const std::string io_json = JoinPath(context, "io.json");
  ASSIGN_OR_RETURN(const bool has_io_json, CheckInputFile(io_json));
  if (!config.has_value() && has_io_json) {
    // A malformed or oversized io.json leaves the weights readable: only --format hf, which
    // needs the config, is refused with it.
    ASSIGN_OR_RETURN(const uint64_t size, InputFileSize(io_json));
    absl::StatusOr<std::optional<YamlNode>> recorded = absl::ResourceExhaustedError(
        absl::StrCat(io_json, ": ", size, " bytes, more than the ", kMaxNemoIoJsonBytes, " read"));
    if (size <= kMaxNemoIoJsonBytes) {
      ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(io_json, kMaxNemoIoJsonBytes));
      recorded = NemoIoJsonModelConfig(text, io_json);
    }
    if (!recorded.ok()) {
      model.training_state.args_problem = recorded.status();
    } else if (recorded->has_value()) {
      config = **std::move(recorded);
    } else {
      absl::StrAppend(&no_config, no_config.empty() ? "" : "; ",
                      "context/io.json: no model config (the TrainerContext's model.config)");
    }
  }
  if (config.has_value()) {
    StructureNode args = ConfigAsArgs(*config);
    for (const char* name : {"tokenizer.model", "vocab.json"}) {
      if (std::find(tokenizer.begin(), tokenizer.end(), name) == tokenizer.end()) continue;
      const std::string file = JoinPath(tokenizer_dir, name);
      ASSIGN_OR_RETURN(const uint64_t size, InputFileSize(file));
      if (size > kMaxConfigBytes) continue;
      ASSIGN_OR_RETURN(const std::string bytes, ReadSmallFile(file, kMaxConfigBytes));
      if (std::optional<int64_t> vocab = TokenizerVocabSize(name, bytes)) {
        AddVocabSize(args, *vocab);
        break;
      }
    }
    model.training_state.values["megatron.args"] = std::move(args);
  } else if (!no_config.empty()) {
    model.parts[0].other_entries.push_back(
        absl::StrCat(no_config, "; --format hf needs --config"));
  }
  model.description = absl::StrCat(
      "NeMo 2 folder (context/, weights/)",
      tokenizer.empty() ? "" : absl::StrCat(", tokenizer files: ", absl::StrJoin(tokenizer, ", ")),
      "; ", model.description);
  return model;
}

}  // namespace

std::string StripArtifactHash(absl::string_view name) {
  const size_t slash = name.rfind('/');
  absl::string_view base = slash == absl::string_view::npos ? name : name.substr(slash + 1);
  if (base.size() > 33 && base[32] == '_') {
    bool hex = true;
    for (char c : base.substr(0, 32)) hex &= absl::ascii_isxdigit(c) && !absl::ascii_isupper(c);
    if (hex) return std::string(base.substr(33));
  }
  return std::string(base);
}

std::vector<PartitionRule> NemoPartitionRules(bool swiglu, int64_t qkv_unit_rows) {
  std::vector<PartitionRule> rules = {
      PartitionRule{"linear_qkv\\.(weight|bias)$", false, 0, 1, qkv_unit_rows},
      PartitionRule{"linear_fc1\\.(weight|bias)$", false, 0, swiglu ? 2 : 1},
      PartitionRule{"(linear_proj|linear_fc2)\\.weight$", false, 1},
      PartitionRule{"(linear_proj|linear_fc2)\\.bias$|layer_norm_(weight|bias)$", true},
      // Transformer Engine's extra state when saved as a tensor (its FP8 metadata).
      PartitionRule{"\\._extra_state$", true},
  };
  for (PartitionRule& rule : MegatronPartitionRules(swiglu, qkv_unit_rows)) {
    rules.push_back(std::move(rule));
  }
  return rules;
}

absl::StatusOr<bool> NemoInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (folder) {
    ASSIGN_OR_RETURN(const bool context, CheckInputFolder(JoinPath(path, "context")));
    if (!context) return false;
    return CheckInputFolder(JoinPath(path, "weights"));
  }
  ASSIGN_OR_RETURN(const bool file, CheckInputFile(path));
  if (!file) return false;
  ASSIGN_OR_RETURN(const std::string head, ReadFilePrefix(path, TarArchive::kBlock));
  return head.size() == TarArchive::kBlock && head.compare(kTarMagicOffset, 5, "ustar") == 0;
}

absl::StatusOr<InputModel> NemoInput::Read(const std::string& path,
                                           const ReadOptions& options) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (folder) return ReadNemo2(path, options);
  return ReadNemo1(path, options);
}

namespace {
const InputFormatRegistration<NemoInput> register_input;
}  // namespace

}  // namespace reshard
