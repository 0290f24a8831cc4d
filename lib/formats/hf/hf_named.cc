#include "lib/formats/hf/hf_named.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/hf/hf_config.h"
#include "lib/formats/hf/hf_import.h"
#include "lib/formats/hf/hf_import_config.h"
#include "lib/formats/hf/model_files.h"
#include "lib/io/file_access.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

constexpr char kConfigName[] = "config.json";

// The family's word embeddings, which every model of it has: what proves a wrapper prefix.
absl::string_view EmbeddingName(const HfFamily& family) {
  return family.gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
}

// The longest prefix p ("" or ending in '.') such that p + the family's embedding name is a
// tensor of `catalog` and every tensor's name starts with p.
std::string WrapperPrefix(const Catalog& catalog, const HfFamily& family) {
  const absl::string_view embedding = EmbeddingName(family);
  std::string longest;
  for (const CatalogTensor& tensor : catalog.tensors) {
    if (!absl::EndsWith(tensor.name, embedding)) continue;
    const std::string prefix = tensor.name.substr(0, tensor.name.size() - embedding.size());
    if (prefix.size() <= longest.size() || !absl::EndsWith(prefix, ".")) continue;
    bool wraps_all = true;
    for (const CatalogTensor& other : catalog.tensors) {
      if (!absl::StartsWith(other.name, prefix)) {
        wraps_all = false;
        break;
      }
    }
    if (wraps_all) longest = prefix;
  }
  return longest;
}

}  // namespace

absl::StatusOr<HfNamedModel> ReadHfNamedModel(const std::string& input,
                                              const HfExportOptions& hf, const Catalog& catalog) {
  if (hf.vocab_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab-size ", hf.vocab_size,
        ": a model under Hugging Face names keeps the vocabulary config.json gives (--vocab-size "
        "trims a Megatron checkpoint's padded vocabulary)"));
  }
  HfNamedModel named;
  nlohmann::ordered_json config;
  if (!hf.config_file.empty()) {
    named.config_path = hf.config_file;
    ASSIGN_OR_RETURN(config, ReadHfConfigOverrides(hf.config_file));
  } else {
    std::vector<std::string> looked_in;
    ASSIGN_OR_RETURN(const std::vector<ModelFile> files,
                     FindTrainingSaveModelFiles(input, &looked_in));
    for (const ModelFile& file : files) {
      if (file.name == kConfigName) named.config_path = file.path;
    }
    if (named.config_path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no config.json beside the training save (looked in ", absl::StrJoin(looked_in, " and "),
          "): --format hf writes a model under Hugging Face names with its config.json; give "
          "--config FILE (the model's config.json; --tokenizer DIR for its tokenizer)"));
    }
    ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(named.config_path, kMaxConfigBytes),
                     named.config_path);
    config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) {
      return absl::DataLossError(absl::StrCat(named.config_path,
                                              ": not a JSON object (config.json's keys and "
                                              "values); give --config FILE in its place"));
    }
  }
  if (!hf.family.empty() && hf.family != "auto") {
    ASSIGN_OR_RETURN(named.family, FindHfFamily(hf.family));
  } else {
    ASSIGN_OR_RETURN(named.family, HfImportFamilyOfConfig(config, named.config_path, kExportAsHf));
  }
  named.prefix = WrapperPrefix(catalog, *named.family);
  Catalog renamed;
  renamed.format = catalog.format;
  renamed.files = catalog.files;
  renamed.tensors = catalog.tensors;
  for (CatalogTensor& tensor : renamed.tensors) tensor.name.erase(0, named.prefix.size());
  renamed.Reindex();
  RETURN_IF_ERROR(ImportHfAsMegatron(renamed, config, named.config_path, /*tensor_parallel=*/1,
                                     /*pipeline_parallel=*/1, named.family, kExportAsHf)
                      .status(),
                  absl::StrCat("reading the tensors as a ", named.family->id, " model",
                               named.prefix.empty() ? ""
                                                    : absl::StrCat(" (wrapper prefix \"",
                                                                   named.prefix, "\" stripped)")));
  return named;
}

absl::StatusOr<bool> PresentHfNamedModel(const std::string& input, const HfExportOptions& hf,
                                         InputModel& model, Catalog& catalog) {
  if (!IsHfNamedTrainingFormat(model.format)) return false;
  ASSIGN_OR_RETURN(const HfNamedModel named, ReadHfNamedModel(input, hf, catalog));
  for (CatalogTensor& tensor : catalog.tensors) tensor.name.erase(0, named.prefix.size());
  catalog.Reindex();
  // The nesting names the tensors as they were; the hf output writes a flat file.
  catalog.structure = nullptr;
  model.training_state.values[kHfNamedFamilyKey] =
      StructureNode::String(std::string(named.family->id));
  model.description = absl::StrCat(model.description, model.description.empty() ? "" : "; ",
                                   DescribeHfNamedModel(named));
  return true;
}

std::string DescribeHfNamedModel(const HfNamedModel& named) {
  return absl::StrCat("Hugging Face ", named.family->id, " model (config.json: ",
                      named.config_path,
                      named.prefix.empty()
                          ? ""
                          : absl::StrCat("; wrapper prefix \"", named.prefix, "\" stripped"),
                      ")");
}

}  // namespace reshard
