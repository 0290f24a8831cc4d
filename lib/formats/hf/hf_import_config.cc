#include "lib/formats/hf/hf_import_config.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/exec/tensor_compare.h"
#include "lib/formats/hf/hf_config.h"
#include "lib/formats/hf/model_files.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kConfigName[] = "config.json";

// config.json as read, with its path for messages.
class Config {
 public:
  Config(const Json& json, const std::string& path, absl::string_view as_what)
      : json_(json), path_(path), as_what_(as_what) {}

  const Json* Find(const char* key) const {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // A positive integer `key`; `fallback` when absent (nullopt: required).
  absl::StatusOr<int64_t> Int(const char* key,
                              std::optional<int64_t> fallback = std::nullopt) const {
    const Json* value = Find(key);
    if (value == nullptr) {
      if (fallback.has_value()) return *fallback;
      return absl::InvalidArgumentError(absl::StrCat(
          path_, " has no ", key, ", which ",
          as_what_ == kExportAsHf ? "--format hf checks the weights' shapes with"
                                  : absl::StrCat("the ", as_what_, " args need")));
    }
    if (!value->is_number_integer() || value->get<int64_t>() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": ", key, " must be a positive integer, got ", value->dump()));
    }
    return value->get<int64_t>();
  }

  absl::StatusOr<double> Number(const char* key, double fallback) const {
    return Typed<double>(key, fallback, &Json::is_number, "a number");
  }

  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    return Typed<bool>(key, fallback, &Json::is_boolean, "true or false");
  }

  const std::string& path() const { return path_; }
  // What the model is imported as ("Megatron-LM", "Megatron-Core torch_dist"), for messages.
  absl::string_view as_what() const { return as_what_; }

 private:
  // `key` as a T when `is` accepts it; `fallback` when absent.
  template <typename T>
  absl::StatusOr<T> Typed(const char* key, T fallback, bool (Json::*is)() const noexcept,
                          const char* what) const {
    const Json* value = Find(key);
    if (value == nullptr) return fallback;
    if (!(value->*is)()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": ", key, " must be ", what, ", got ", value->dump()));
    }
    return value->get<T>();
  }

  const Json& json_;
  const std::string& path_;
  absl::string_view as_what_;
};

absl::StatusOr<const HfFamily*> FamilyOfConfig(const Config& config) {
  std::string model_type;
  std::string architecture;
  if (const Json* value = config.Find("model_type"); value != nullptr && value->is_string()) {
    model_type = value->get<std::string>();
  }
  if (const Json* value = config.Find("architectures");
      value != nullptr && value->is_array() && !value->empty() && (*value)[0].is_string()) {
    architecture = (*value)[0].get<std::string>();
  }
  for (const HfFamily& family : HfFamilies()) {
    if (!model_type.empty() ? family.model_type == model_type
                            : family.architecture == architecture) {
      return &family;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      config.path(), " describes a model of model_type \"", model_type, "\" (architectures \"",
      architecture, "\"), which is none of the families ",
      config.as_what() == kExportAsHf ? "--format hf writes"
                                      : absl::StrCat("reshard imports into ", config.as_what()),
      ": ", HfFamilyList(), " (--family F reads the weights as one of them)"));
}

absl::StatusOr<HfImportSizes> ReadSizes(const Config& config, const HfFamily& family) {
  HfImportSizes sizes;
  if (family.gpt2) {
    ASSIGN_OR_RETURN(sizes.hidden, config.Int("n_embd"));
    ASSIGN_OR_RETURN(sizes.layers, config.Int("n_layer"));
    ASSIGN_OR_RETURN(sizes.heads, config.Int("n_head"));
    ASSIGN_OR_RETURN(sizes.ffn, config.Int("n_inner", 4 * sizes.hidden));
    ASSIGN_OR_RETURN(sizes.positions, config.Int("n_positions"));
    ASSIGN_OR_RETURN(sizes.norm_epsilon, config.Number("layer_norm_epsilon", 1e-5));
    ASSIGN_OR_RETURN(sizes.tied, config.Bool("tie_word_embeddings", true));
    if (sizes.hidden % sizes.heads != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.path(), ": n_embd ", sizes.hidden, " is not divisible by n_head ",
                       sizes.heads, ": GPT-2's heads split the hidden size evenly"));
    }
    sizes.groups = sizes.heads;
    sizes.head_dim = sizes.hidden / sizes.heads;
  } else {
    ASSIGN_OR_RETURN(sizes.hidden, config.Int("hidden_size"));
    ASSIGN_OR_RETURN(sizes.layers, config.Int("num_hidden_layers"));
    ASSIGN_OR_RETURN(sizes.heads, config.Int("num_attention_heads"));
    ASSIGN_OR_RETURN(sizes.groups, config.Int("num_key_value_heads", sizes.heads));
    ASSIGN_OR_RETURN(sizes.head_dim, config.Int("head_dim", sizes.hidden / sizes.heads));
    ASSIGN_OR_RETURN(sizes.ffn, config.Int("intermediate_size"));
    ASSIGN_OR_RETURN(sizes.positions, config.Int("max_position_embeddings"));
    ASSIGN_OR_RETURN(sizes.norm_epsilon, config.Number("rms_norm_eps", 1e-6));
    ASSIGN_OR_RETURN(sizes.rope_theta, config.Number("rope_theta", 10000.0));
    ASSIGN_OR_RETURN(sizes.tied, config.Bool("tie_word_embeddings", false));
    if (sizes.heads % sizes.groups != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(config.path(), ": num_attention_heads ", sizes.heads,
                       " is not divisible by num_key_value_heads ", sizes.groups,
                       " (query groups): every group must hold the same number of query heads"));
    }
    // --format hf keeps config.json's rope_scaling as it is; an import writes it as args.
    const Json* scaling =
        config.as_what() == kExportAsHf ? nullptr : config.Find("rope_scaling");
    if (scaling != nullptr) {
      // The keys compared as JSON values: a key of another type is no match (no exception).
      auto is = [&](const char* key, const Json& want) {
        return scaling->is_object() && scaling->contains(key) && (*scaling)[key] == want;
      };
      const bool llama3 = is("rope_type", "llama3") && is("low_freq_factor", 1.0) &&
                          is("high_freq_factor", 4.0) &&
                          is("original_max_position_embeddings", 8192) &&
                          scaling->contains("factor") && (*scaling)["factor"].is_number();
      if (!llama3) {
        return absl::InvalidArgumentError(absl::StrCat(
            config.path(), ": rope_scaling ", scaling->dump(),
            " is not Llama 3.1's (rope_type llama3, low_freq_factor 1, high_freq_factor 4, "
            "original_max_position_embeddings 8192), the only one the ",
            config.as_what(), " args can say (use_rope_scaling, rope_scaling_factor)"));
      }
      sizes.rope_scaling_factor = (*scaling)["factor"].get<double>();
    }
  }
  ASSIGN_OR_RETURN(sizes.vocab, config.Int("vocab_size"));
  if (family.moe) {
    ASSIGN_OR_RETURN(sizes.experts, config.Int("num_local_experts"));
    ASSIGN_OR_RETURN(sizes.top_k, config.Int("num_experts_per_tok"));
    if (config.Find("router_aux_loss_coef") != nullptr) {
      ASSIGN_OR_RETURN(sizes.aux_loss_coef, config.Number("router_aux_loss_coef", 0.0));
    }
  }
  return sizes;
}

}  // namespace

bool IsHfImportInput(const InputModel& model) {
  // Any one safetensors model; torch.save files only as save_pretrained(safe_serialization=
  // False) names them, since other torch.save checkpoints are no Hugging Face model.
  return (model.format == "safetensors" && model.parts.size() == 1) || IsSavePretrainedModel(model);
}

absl::StatusOr<Json> ReadHfInputConfig(const std::string& input, const std::string& config_file,
                                       std::string* config_path, absl::string_view as_what) {
  if (!config_file.empty()) {
    *config_path = config_file;
    return ReadHfConfigOverrides(config_file);
  }
  std::string folder = input;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  if (absl::EndsWith(folder, ".safetensors") || absl::EndsWith(folder, ".bin") ||
      absl::EndsWith(folder, ".json")) {
    const size_t slash = folder.rfind('/');
    folder = slash == std::string::npos ? "." : folder.substr(0, slash);
  }
  *config_path = absl::StrCat(folder, "/", kConfigName);
  absl::StatusOr<std::string> text = ReadSmallFile(*config_path, kMaxConfigBytes);
  // Without config.json the input is no model a Megatron writer takes: the request is invalid
  // (as for any other format's input), not a missing file the user named.
  if (absl::IsNotFound(text.status())) {
    return absl::InvalidArgumentError(absl::StrCat(
        *config_path, " not found: a Hugging Face model is imported into ", as_what,
        " with the config.json save_pretrained writes beside the weights (sizes, heads, "
        "vocabulary), or the one --config FILE names; other input must be a Megatron "
        "checkpoint"));
  }
  if (!text.ok()) return Annotate(text.status(), *config_path);
  Json parsed = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(*config_path, ": not a JSON object"));
  }
  return parsed;
}

absl::StatusOr<const HfFamily*> HfImportFamilyOfConfig(const Json& config,
                                                       const std::string& config_path,
                                                       absl::string_view as_what) {
  return FamilyOfConfig(Config(config, config_path, as_what));
}

absl::StatusOr<HfImportSizes> ReadHfImportSizes(const Json& config, const std::string& config_path,
                                                const HfFamily& family, absl::string_view as_what) {
  return ReadSizes(Config(config, config_path, as_what), family);
}

absl::StatusOr<SavedTiedHead> FindSavedTiedHead(const Catalog& catalog, const HfFamily& family,
                                                const std::string& config_path) {
  SavedTiedHead found;
  found.head = catalog.Find(kHfLmHead);
  if (found.head < 0) return SavedTiedHead{};
  const std::string embedding_name =
      family.gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  found.embedding = catalog.Find(embedding_name);
  if (found.embedding < 0) {
    return absl::InvalidArgumentError(absl::StrCat("the model has no tensor \"", embedding_name,
                                                   "\", which a ", family.id, " model of ",
                                                   config_path, " has"));
  }
  const CatalogTensor& saved = catalog.tensors[found.head];
  const CatalogTensor& words = catalog.tensors[found.embedding];
  if (saved.shape != words.shape || saved.dtype != words.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", kHfLmHead, "\" is ", DTypeName(saved.dtype), " ",
                     ShapeToString(saved.shape), " but \"", embedding_name, "\" is ",
                     DTypeName(words.dtype), " ", ShapeToString(words.shape), ", while ",
                     config_path, " says tie_word_embeddings: true (the head is the embedding)"));
  }
  return found;
}

absl::Status CheckTiedHeadEqualsEmbedding(const Catalog& catalog, int head, int embedding,
                                          const std::string& config_path,
                                          absl::string_view as_what) {
  const CatalogTensor& saved = catalog.tensors[head];
  const CatalogTensor& words = catalog.tensors[embedding];
  ASSIGN_OR_RETURN(const std::optional<int64_t> differs,
                   FirstDifferingElement(catalog, head, embedding),
                   absl::StrCat("comparing tensor \"", saved.name, "\" with \"", words.name,
                                "\" (tie_word_embeddings)"));
  if (!differs.has_value()) return absl::OkStatus();
  const int64_t columns = saved.shape.size() == 2 ? saved.shape[1] : 1;
  const std::string file =
      saved.pieces.empty() ? std::string("the model") : catalog.files[saved.pieces[0].file].path;
  return absl::InvalidArgumentError(absl::StrCat(
      file, ": tensor \"", saved.name, "\" differs from tensor \"", words.name,
      "\" first at element ", *differs, " (row ", *differs / columns, ", column ",
      *differs % columns, "), but ", config_path,
      " says tie_word_embeddings: true, under which transformers loads the embedding as the "
      "head and ignores the saved one; set tie_word_embeddings to false in config.json to "
      "import the saved head as the ",
      as_what, " output layer, or remove it from the weights"));
}

}  // namespace reshard
