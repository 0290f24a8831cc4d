#include "lib/formats/hf/hf_config.h"

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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/hf/sentencepiece_model.h"
#include "lib/io/byte_source.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"

namespace reshard {
namespace {

using Json = nlohmann::ordered_json;
using Kind = StructureNode::Kind;

// --config files are small; this bounds what is read.
constexpr uint64_t kMaxConfigBytes = 1 << 20;

std::optional<double> FloatArg(const StructureNode* args, absl::string_view key) {
  const StructureNode* value = HfArg(args, key);
  if (value == nullptr) return std::nullopt;
  if (value->kind == Kind::kFloat) return value->real;
  if (value->kind == Kind::kInt) return static_cast<double>(value->integer);
  return std::nullopt;
}

// torch_dtype's names.
absl::string_view TorchDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      return DTypeName(dtype);
  }
}

// config[key] as a positive integer.
absl::StatusOr<int64_t> PositiveInt(const Json& config, const char* key) {
  const Json& value = config[key];
  if (!value.is_number_integer() || value.get<int64_t>() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json's ", key, " must be a positive integer, got ", value.dump()));
  }
  return value.get<int64_t>();
}

}  // namespace

const StructureNode* HfArg(const StructureNode* args, absl::string_view key) {
  const StructureNode* value = FindKey(args, key);
  if (value == nullptr || value->kind == Kind::kNone) return nullptr;
  return value;
}

bool HfArgSet(const StructureNode* args, absl::string_view key) {
  const StructureNode* value = HfArg(args, key);
  if (value == nullptr) return false;
  if (value->kind == Kind::kBool) return value->boolean;
  if (value->kind == Kind::kInt) return value->integer != 0;
  return true;
}

absl::StatusOr<Json> ReadHfConfigOverrides(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(path, kMaxConfigBytes),
                   absl::StrCat("--config ", path));
  Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config ", path, ": not a JSON object (config.json's keys and values)"));
  }
  return parsed;
}

namespace {

// config.json keys the args could not give, with the arg each comes from.
using MissingKeys = std::vector<std::pair<std::string, std::string>>;

// Sets config[key] to `value`, or to null and records it as missing.
void SetInt(Json& config, MissingKeys& missing, const char* key, std::optional<int64_t> value,
            const char* arg) {
  if (value.has_value()) {
    config[key] = *value;
  } else {
    config[key] = nullptr;
    missing.emplace_back(key, arg);
  }
}

std::optional<double> LayerNormEpsilon(const StructureNode* args) {
  std::optional<double> eps = FloatArg(args, "norm_epsilon");
  if (!eps.has_value()) eps = FloatArg(args, "layernorm_epsilon");
  return eps;
}

// GPT2Config's keys (hf_config.h): the figures transformers' convert_megatron_gpt2_checkpoint.py
// takes from the args, its fixed dropout and initialisation values, and the activation it
// derives from the args.
Json Gpt2ConfigJson(const HfConfigSources& sources, MissingKeys& missing) {
  const StructureNode* args = sources.args;
  Json config = Json::object();
  config["architectures"] = Json::array({std::string(sources.family->architecture)});
  config["model_type"] = std::string(sources.family->model_type);
  std::optional<int64_t> vocab = IntAttribute(args, "vocab_size");
  if (sources.vocab_size > 0) vocab = sources.vocab_size;
  SetInt(config, missing, "vocab_size", vocab, "--vocab-size or args.vocab_size");
  SetInt(config, missing, "n_positions", IntAttribute(args, "max_position_embeddings"),
         "args.max_position_embeddings");
  const std::optional<int64_t> hidden = IntAttribute(args, "hidden_size");
  SetInt(config, missing, "n_embd", hidden, "args.hidden_size");
  SetInt(config, missing, "n_layer", IntAttribute(args, "num_layers"), "args.num_layers");
  SetInt(config, missing, "n_head", IntAttribute(args, "num_attention_heads"),
         "args.num_attention_heads");
  // GPT2Config's n_inner: null means 4 * n_embd.
  const std::optional<int64_t> ffn = IntAttribute(args, "ffn_hidden_size");
  config["n_inner"] =
      ffn.has_value() && !(hidden.has_value() && *ffn == 4 * *hidden) ? Json(*ffn) : Json(nullptr);
  // Megatron's fused bias-gelu and openai_gelu are the tanh approximation, its plain gelu the
  // erf one.
  config["activation_function"] = HfArgSet(args, "bias_gelu_fusion") ? "gelu_fast"
                                  : HfArgSet(args, "openai_gelu")    ? "gelu_new"
                                                                     : "gelu";
  config["resid_pdrop"] = 0.1;
  config["embd_pdrop"] = 0.1;
  config["attn_pdrop"] = 0.1;
  if (const std::optional<double> eps = LayerNormEpsilon(args); eps.has_value()) {
    config["layer_norm_epsilon"] = *eps;
  } else {
    config["layer_norm_epsilon"] = nullptr;
    missing.emplace_back("layer_norm_epsilon", "args.layernorm_epsilon");
  }
  config["initializer_range"] = 0.02;
  config["scale_attn_weights"] = true;
  config["tie_word_embeddings"] = sources.tied;
  config["torch_dtype"] = std::string(TorchDTypeName(sources.dtype));
  config["use_cache"] = true;
  return config;
}

}  // namespace

absl::StatusOr<HfModelConfig> MakeHfConfig(const HfConfigSources& sources) {
  const StructureNode* args = sources.args;
  const HfFamily& family = *sources.family;
  Json config = Json::object();
  MissingKeys missing;
  auto from_int = [&](const char* key, std::optional<int64_t> value, const char* arg) {
    SetInt(config, missing, key, value, arg);
  };
  if (family.gpt2) {
    config = Gpt2ConfigJson(sources, missing);
  } else {
    config["architectures"] = Json::array({std::string(family.architecture)});
    config["model_type"] = std::string(family.model_type);
    from_int("hidden_size", IntAttribute(args, "hidden_size"), "args.hidden_size");
    if (family.moe) {
      // An expert's MLP: Megatron's moe_ffn_hidden_size defaults to ffn_hidden_size.
      std::optional<int64_t> expert_ffn = IntAttribute(args, "moe_ffn_hidden_size");
      if (!expert_ffn.has_value()) expert_ffn = IntAttribute(args, "ffn_hidden_size");
      from_int("intermediate_size", expert_ffn, "args.moe_ffn_hidden_size");
    } else {
      from_int("intermediate_size", IntAttribute(args, "ffn_hidden_size"), "args.ffn_hidden_size");
    }
    from_int("num_hidden_layers", IntAttribute(args, "num_layers"), "args.num_layers");
    const std::optional<int64_t> heads = IntAttribute(args, "num_attention_heads");
    from_int("num_attention_heads", heads, "args.num_attention_heads");
    std::optional<int64_t> kv_heads = heads;
    if (IntAttribute(args, "group_query_attention").value_or(0) != 0) {
      kv_heads = IntAttribute(args, "num_query_groups");
    } else if (HfArg(args, "group_query_attention") == nullptr) {
      // Megatron-DeepSpeed has no group_query_attention: its num_key_value_heads (the heads
      // when not given) is the number of groups.
      if (const std::optional<int64_t> groups = IntAttribute(args, "num_key_value_heads");
          groups.value_or(0) > 0) {
        kv_heads = groups;
      }
    }
    from_int("num_key_value_heads", kv_heads, "args.num_query_groups");
    std::optional<int64_t> head_dim = IntAttribute(args, "kv_channels");
    const std::optional<int64_t> hidden = IntAttribute(args, "hidden_size");
    if (!head_dim.has_value() && hidden.has_value() && heads.value_or(0) > 0) {
      head_dim = *hidden / *heads;
    }
    from_int("head_dim", head_dim, "args.kv_channels");
    config["hidden_act"] = "silu";
    from_int("max_position_embeddings", IntAttribute(args, "max_position_embeddings"),
             "args.max_position_embeddings");
    const std::optional<double> eps = LayerNormEpsilon(args);
    if (eps.has_value()) {
      config["rms_norm_eps"] = *eps;
    } else {
      config["rms_norm_eps"] = nullptr;
      missing.emplace_back("rms_norm_eps", "args.norm_epsilon");
    }
    // Megatron-LM's rotary_base; Megatron-DeepSpeed's rope_theta.
    std::optional<double> theta = FloatArg(args, "rotary_base");
    if (!theta.has_value()) theta = FloatArg(args, "rope_theta");
    if (theta.has_value()) {
      config["rope_theta"] = *theta;
    } else {
      config["rope_theta"] = nullptr;
      missing.emplace_back("rope_theta", "args.rotary_base");
    }
    if (IntAttribute(args, "use_rope_scaling").value_or(0) != 0) {
      Json scaling = Json::object();
      scaling["rope_type"] = "llama3";
      scaling["factor"] = FloatArg(args, "rope_scaling_factor").value_or(8.0);
      scaling["low_freq_factor"] = 1.0;
      scaling["high_freq_factor"] = 4.0;
      scaling["original_max_position_embeddings"] = 8192;
      config["rope_scaling"] = std::move(scaling);
    } else {
      config["rope_scaling"] = nullptr;
    }
    std::optional<int64_t> vocab = IntAttribute(args, "vocab_size");
    if (sources.vocab_size > 0) vocab = sources.vocab_size;
    from_int("vocab_size", vocab, "--vocab-size or args.vocab_size");
    config["tie_word_embeddings"] = sources.tied;
    if (family.sliding_window) {
      const std::optional<int64_t> window = IntAttribute(args, "sliding_window");
      config["sliding_window"] = window.has_value() ? Json(*window) : Json(nullptr);
    } else {
      config["attention_bias"] = family.qkv_bias;
    }
    if (family.moe) {
      from_int("num_local_experts", IntAttribute(args, "num_experts"), "args.num_experts");
      from_int("num_experts_per_tok", IntAttribute(args, "moe_router_topk"),
               "args.moe_router_topk");
      if (const std::optional<double> coef = FloatArg(args, "moe_aux_loss_coeff");
          coef.has_value()) {
        config["router_aux_loss_coef"] = *coef;
      }
    }
    config["torch_dtype"] = std::string(TorchDTypeName(sources.dtype));
    config["use_cache"] = true;
  }

  // --config completes and overrides; --vocab-size beats both.
  if (sources.overrides.is_object()) {
    for (const auto& [key, value] : sources.overrides.items()) {
      if (key == "tie_word_embeddings" && value != Json(sources.tied)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--config says tie_word_embeddings ", value.dump(), ", but the checkpoint ",
            sources.tied ? "has no separate output layer (its embeddings are tied)"
                         : "has a separate output layer"));
      }
      config[key] = value;
    }
  }
  if (sources.vocab_size > 0) config["vocab_size"] = sources.vocab_size;
  std::vector<std::string> still_missing;
  for (const auto& [key, arg] : missing) {
    if (config[key].is_null()) still_missing.push_back(absl::StrCat(key, " (from ", arg, ")"));
  }
  if (!still_missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json needs ", absl::StrJoin(still_missing, ", "),
                     ", which the checkpoint's args do not record; give ",
                     still_missing.size() == 1 ? "it" : "them",
                     " in --config FILE (a JSON object of "
                     "config.json keys)",
                     absl::StrContains(absl::StrJoin(still_missing, ","), "vocab_size")
                         ? " or give the true vocabulary with --vocab-size N"
                         : ""));
  }

  HfModelConfig model;
  if (family.gpt2) {
    ASSIGN_OR_RETURN(model.hidden, PositiveInt(config, "n_embd"));
    ASSIGN_OR_RETURN(model.layers, PositiveInt(config, "n_layer"));
    ASSIGN_OR_RETURN(model.heads, PositiveInt(config, "n_head"));
    ASSIGN_OR_RETURN(model.positions, PositiveInt(config, "n_positions"));
    ASSIGN_OR_RETURN(model.vocab, PositiveInt(config, "vocab_size"));
    if (config["n_inner"].is_null()) {
      model.intermediate = 4 * model.hidden;
    } else {
      ASSIGN_OR_RETURN(model.intermediate, PositiveInt(config, "n_inner"));
    }
    if (model.hidden % model.heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("n_embd ", model.hidden, " is not divisible by n_head ", model.heads,
                       ": GPT-2's heads split the hidden size evenly"));
    }
    model.kv_heads = model.heads;
    model.head_dim = model.hidden / model.heads;
    model.json = std::move(config);
    return model;
  }
  ASSIGN_OR_RETURN(model.hidden, PositiveInt(config, "hidden_size"));
  ASSIGN_OR_RETURN(model.intermediate, PositiveInt(config, "intermediate_size"));
  ASSIGN_OR_RETURN(model.layers, PositiveInt(config, "num_hidden_layers"));
  ASSIGN_OR_RETURN(model.heads, PositiveInt(config, "num_attention_heads"));
  ASSIGN_OR_RETURN(model.kv_heads, PositiveInt(config, "num_key_value_heads"));
  ASSIGN_OR_RETURN(model.head_dim, PositiveInt(config, "head_dim"));
  ASSIGN_OR_RETURN(model.vocab, PositiveInt(config, "vocab_size"));
  if (family.moe) {
    ASSIGN_OR_RETURN(model.experts, PositiveInt(config, "num_local_experts"));
    ASSIGN_OR_RETURN(const int64_t top_k, PositiveInt(config, "num_experts_per_tok"));
    if (top_k > model.experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json's num_experts_per_tok ", top_k, " is more than its ",
                       model.experts, " num_local_experts: the router picks among the experts"));
    }
  }
  if (model.heads % model.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_attention_heads ", model.heads, " is not divisible by num_key_value_heads ",
        model.kv_heads, " (query groups): every group must hold the same number of query heads"));
  }
  model.json = std::move(config);
  return model;
}

namespace {

// The small tokenizer files (tokenizer_config.json with its chat template) are read up to this.
constexpr uint64_t kMaxTokenizerConfigBytes = 16 << 20;

constexpr char kTokenizerJson[] = "tokenizer.json";
constexpr char kTokenizerModel[] = "tokenizer.model";

// The name a carried file takes in the output.
const std::string& NameOfCarried(const std::pair<std::string, std::string>& file) {
  return file.first;
}
const std::string& NameOfCarried(const EmbeddedModelFile& file) { return file.name; }

absl::Status CheckSentencePieceSize(const std::string& what, uint64_t size) {
  if (size <= kMaxSentencePieceModelBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": a tokenizer.model of ", size, " bytes, more than the ",
      kMaxSentencePieceModelBytes, " read for its special token ids (give bos_token_id and "
      "eos_token_id with --config)"));
}
constexpr const char* kTokenNamers[] = {"tokenizer_config.json", "special_tokens_map.json"};

// Parses `text` read from `path`; `callback` (nlohmann's parser_callback_t) keeps what it
// accepts. DataLoss naming the file and the byte offset when it is not valid JSON.
absl::StatusOr<Json> ParseTokenizerFile(const std::string& text, const std::string& path,
                                        const Json::parser_callback_t& callback = nullptr) {
  try {
    return Json::parse(text, callback);
  } catch (const Json::parse_error& error) {
    // error.byte counts the characters read, the offending one included.
    return absl::DataLossError(absl::StrCat(path, ": not valid JSON at byte offset ",
                                            error.byte > 0 ? error.byte - 1 : 0, " (", error.what(),
                                            ")"));
  }
}

// The content of special token `value`: a string, or an AddedToken's "content"; empty when
// neither (null: the tokenizer has no such token).
std::string TokenContent(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) {
    const auto content = value.find("content");
    if (content != value.end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

}  // namespace

absl::StatusOr<HfSpecialTokens> HfSpecialTokenIds(
    const std::vector<std::pair<std::string, std::string>>& files) {
  const std::map<std::string, std::string> paths(files.begin(), files.end());
  HfSpecialTokens ids;
  const auto tokenizer = paths.find(kTokenizerJson);
  if (tokenizer == paths.end()) return ids;
  // The token each key names; "" when the files disagree or name none.
  constexpr const char* kKeys[] = {"bos_token", "eos_token", "pad_token"};
  std::map<std::string, std::set<std::string>> named;
  for (const char* name : kTokenNamers) {
    const auto found = paths.find(name);
    if (found == paths.end()) continue;
    ASSIGN_OR_RETURN(const std::string text,
                     ReadSmallFile(found->second, kMaxTokenizerConfigBytes));
    ASSIGN_OR_RETURN(const Json json, ParseTokenizerFile(text, found->second));
    if (!json.is_object()) continue;
    for (const char* key : kKeys) {
      const auto value = json.find(key);
      if (value != json.end()) named[key].insert(TokenContent(*value));
    }
  }
  std::set<std::string> wanted;
  for (const auto& [key, tokens] : named) {
    if (tokens.size() == 1 && !tokens.begin()->empty()) wanted.insert(*tokens.begin());
  }
  if (wanted.empty()) return ids;
  ASSIGN_OR_RETURN(const uint64_t size, InputFileSize(tokenizer->second));
  if (size > kMaxTokenizerJsonBytes) return ids;
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(tokenizer->second, size));
  // Keeps added_tokens' ids and contents and the wanted entries of model.vocab; a
  // vocabulary of another shape (Unigram's [piece, score] list) and everything else is
  // skipped unparsed into the DOM, so memory stays that of the text.
  std::vector<std::string> keys;  // keys[d]: the last key at depth d
  auto under = [&](int depth, const char* first, const char* second = nullptr) {
    return static_cast<int>(keys.size()) > depth && keys[1] == first &&
           (second == nullptr || keys[2] == second);
  };
  const Json::parser_callback_t keep = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key) {
      keys.resize(depth + 1);
      keys[depth] = parsed.get<std::string>();
      const std::string& key = keys[depth];
      if (depth == 1) return key == "added_tokens" || key == "model";
      if (depth == 2 && keys[1] == "model") return key == "vocab";
      if (depth == 3 && under(2, "model", "vocab")) return wanted.count(key) > 0;
      if (depth == 3 && under(1, "added_tokens")) return key == "id" || key == "content";
      return true;
    }
    if (event == Json::parse_event_t::array_start && depth == 2) return !under(2, "model", "vocab");
    return true;
  };
  ASSIGN_OR_RETURN(const Json json, ParseTokenizerFile(text, tokenizer->second, keep));
  std::map<std::string, std::set<int64_t>> found;
  if (const auto vocab = json.find("model"); vocab != json.end() && vocab->is_object()) {
    if (const auto entries = vocab->find("vocab");
        entries != vocab->end() && entries->is_object()) {
      for (const auto& [token, id] : entries->items()) {
        if (id.is_number_integer()) found[token].insert(id.get<int64_t>());
      }
    }
  }
  if (const auto added = json.find("added_tokens"); added != json.end() && added->is_array()) {
    for (const Json& token : *added) {
      if (!token.is_object()) continue;
      const std::string content = TokenContent(token);
      const auto id = token.find("id");
      if (wanted.count(content) > 0 && id != token.end() && id->is_number_integer()) {
        found[content].insert(id->get<int64_t>());
      }
    }
  }
  auto id_of = [&](const char* key) -> std::optional<int64_t> {
    const auto tokens = named.find(key);
    if (tokens == named.end() || tokens->second.size() != 1) return std::nullopt;
    const auto token_ids = found.find(*tokens->second.begin());
    if (token_ids == found.end() || token_ids->second.size() != 1) return std::nullopt;
    return *token_ids->second.begin();
  };
  ids.bos_token_id = id_of("bos_token");
  ids.eos_token_id = id_of("eos_token");
  ids.pad_token_id = id_of("pad_token");
  return ids;
}

absl::StatusOr<HfSpecialTokens> HfTokenizerSpecialIds(
    const std::vector<std::pair<std::string, std::string>>& files,
    const std::vector<EmbeddedModelFile>& members) {
  const auto named = [](absl::string_view name) {
    return [name](const auto& file) { return NameOfCarried(file) == name; };
  };
  if (std::any_of(files.begin(), files.end(), named(kTokenizerJson)) ||
      std::any_of(members.begin(), members.end(), named(kTokenizerJson))) {
    return HfSpecialTokenIds(files);
  }
  std::string bytes;
  std::string what;
  if (const auto file = std::find_if(files.begin(), files.end(), named(kTokenizerModel));
      file != files.end()) {
    what = file->second;
    ASSIGN_OR_RETURN(const uint64_t size, InputFileSize(what));
    RETURN_IF_ERROR(CheckSentencePieceSize(what, size));
    ASSIGN_OR_RETURN(bytes, ReadSmallFile(what, kMaxSentencePieceModelBytes));
  } else if (const auto member = std::find_if(members.begin(), members.end(),
                                              named(kTokenizerModel));
             member != members.end()) {
    what = absl::StrCat(member->path, ": member ", member->member);
    RETURN_IF_ERROR(CheckSentencePieceSize(what, member->size));
    ASSIGN_OR_RETURN(const MappedFile archive, MappedFile::Open(member->path));
    const std::unique_ptr<ByteSource> source = ByteSourceFor(archive);
    ASSIGN_OR_RETURN(const absl::string_view view,
                     source->Read(member->offset, member->size, what));
    bytes = std::string(view);
    archive.Release(0, archive.size());
  } else {
    return HfSpecialTokens();
  }
  ASSIGN_OR_RETURN(const SentencePieceModel model, ParseSentencePieceModel(bytes, what));
  HfSpecialTokens ids;
  ids.bos_token_id = model.bos_id;
  ids.eos_token_id = model.eos_id;
  ids.pad_token_id = model.pad_id;
  return ids;
}

std::string HfGenerationConfigJson(const Json& config) {
  Json generation = Json::object();
  generation["_from_model_config"] = true;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (config.contains(key) && !config[key].is_null()) generation[key] = config[key];
  }
  return generation.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace reshard
