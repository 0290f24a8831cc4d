// Reading a Hugging Face model folder for the import into Megatron (hf_import.h): whether an
// input is such a model, the config.json beside its weights (or the one --config names), the
// family and the sizes config.json gives, and the checks of a tied model's saved head. The
// mapping of the tensors onto Megatron's is hf_import.h's.

#ifndef RESHARD_LIB_FORMATS_HF_HF_IMPORT_CONFIG_H_
#define RESHARD_LIB_FORMATS_HF_HF_IMPORT_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"
#include "lib/formats/hf/hf_family.h"
#include "nlohmann/json.hpp"

namespace reshard {

// What the Megatron writers import a Hugging Face model as, named in messages and descriptions.
inline constexpr char kImportAsMegatronLm[] = "Megatron-LM";
inline constexpr char kImportAsTorchDist[] = "Megatron-Core torch_dist";
// Not an import: the weights of a training save under Hugging Face names checked against
// config.json for `--format hf` (hf_named.h). Messages then speak of that output, the
// rope_scaling of config.json is not read (the output keeps config.json), and the tensors may
// be of several dtypes.
inline constexpr char kExportAsHf[] = "--format hf";

// The HF name of the output head.
inline constexpr char kHfLmHead[] = "lm_head.weight";

// The figures of the model the mapping needs, from config.json.
struct HfImportSizes {
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t groups = 0;  // num_key_value_heads
  int64_t head_dim = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  int64_t positions = 0;
  double norm_epsilon = 0;
  std::optional<double> rope_theta;
  std::optional<double> rope_scaling_factor;  // Llama 3.1's rope_scaling
  bool tied = false;
  // Mixtral: experts per layer, experts each token is routed to, the router's load-balancing
  // loss coefficient (when config.json gives it).
  int64_t experts = 0;
  int64_t top_k = 0;
  std::optional<double> aux_loss_coef;
};

// Whether `model` is a Hugging Face model the import takes: one safetensors model, or one
// torch.save model whose files are save_pretrained's (IsHuggingFaceWeightName).
bool IsHfImportInput(const InputModel& model);

// The config.json beside the Hugging Face weights `input` (a folder, or a weight file or index
// in it), parsed; or, when `config_file` is not empty, that file (--config) in its place, which
// `*config_path` then names. InvalidArgument naming the file when there is none or when it is not a
// JSON object.
absl::StatusOr<nlohmann::ordered_json> ReadHfInputConfig(
    const std::string& input, const std::string& config_file, std::string* config_path,
    absl::string_view as_what = kImportAsMegatronLm);

// The family `config` (read from `config_path`) names: model_type, else the first of
// architectures. InvalidArgument naming both and listing the families otherwise; `as_what`
// (kImportAsMegatronLm, kImportAsTorchDist) says in messages what the model is imported as.
absl::StatusOr<const HfFamily*> HfImportFamilyOfConfig(const nlohmann::ordered_json& config,
                                                       const std::string& config_path,
                                                       absl::string_view as_what);

// The sizes of a `family` model from `config`: InvalidArgument naming `config_path` and the
// key for a required key missing, a value of the wrong type, heads not dividing into
// num_key_value_heads (GPT-2: n_embd into n_head), rope_scaling other than Llama 3.1's.
absl::StatusOr<HfImportSizes> ReadHfImportSizes(const nlohmann::ordered_json& config,
                                                const std::string& config_path,
                                                const HfFamily& family, absl::string_view as_what);

// A tied model's saved head (kHfLmHead) and its word embeddings, as indices of the HF catalog;
// -1 when the weights hold no head.
struct SavedTiedHead {
  int head = -1;
  int embedding = -1;
};

// The head a tied `family` model (tie_word_embeddings in `config_path`) saved anyway, which must
// be the embedding's shape and dtype (InvalidArgument naming both otherwise). The embedding
// must be in `catalog`.
absl::StatusOr<SavedTiedHead> FindSavedTiedHead(const Catalog& catalog, const HfFamily& family,
                                                const std::string& config_path);

// The saved head `head` against the embedding `embedding` (tensors of the HF model `catalog`),
// element by element and window by window (FirstDifferingElement): InvalidArgument naming
// both, the file of the head and the first element that differs.
absl::Status CheckTiedHeadEqualsEmbedding(const Catalog& catalog, int head, int embedding,
                                          const std::string& config_path,
                                          absl::string_view as_what);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_HF_IMPORT_CONFIG_H_
