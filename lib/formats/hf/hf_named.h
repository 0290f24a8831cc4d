// A training save of a transformers model, whose tensors already carry the model's Hugging
// Face names, read for `--format hf`:
//
//   reshardctl consolidate IN OUT --format hf [--family F] [--config FILE] [--tokenizer DIR]
//                                             [--dtype D] [--max-shard-size S]
//
// IN is read as deepspeed-zero (HF Trainer + DeepSpeed ZeRO-1/2/3 or plain model states:
// `checkpoint-500/` with `latest`, or its `global_step500/`) or torch-dcp (HF Trainer /
// accelerate + FSDP: `checkpoint-500/pytorch_model_fsdp_0/`), IsHfNamedTrainingFormat in
// model_files.h. The tensors keep their names but for a wrapper prefix, and the rest of the
// output (config.json, generation_config.json, tokenizer) comes from beside the save:
//   - config.json: `--config FILE`, else the one FindTrainingSaveModelFiles finds (the folder
//     given, or the HF Trainer `checkpoint-<N>/` folder right above it; never higher, no symlink
//     out of it). None: InvalidArgument naming the folders looked in and `--config FILE`.
//   - family: `--family F`, else config.json's model_type, else its architectures (the
//     families of hf_family.h).
//   - wrapper prefix: what every name starts with before the family's word embeddings
//     (`model.embed_tokens.weight`, GPT-2's `transformer.wte.weight`): DeepSpeed's `module.`,
//     accelerate's FSDP state dict `model.`, torch.compile's `_orig_mod.`. The family's own
//     names prove it a wrapper; nothing else is stripped.
//   - the names and shapes are checked as the import into Megatron checks a Hugging Face model
//     (ImportHfAsMegatron with kExportAsHf, hf_import.h; no data read): every tensor the family
//     has for config.json's sizes present and shaped so (both shapes named otherwise), none the
//     family lacks (named), a tied model's saved head shaped as the embedding.
// Refusals are InvalidArgument (PermissionDenied for a symlink out) and nothing is written.

#ifndef RESHARD_LIB_FORMATS_HF_HF_NAMED_H_
#define RESHARD_LIB_FORMATS_HF_HF_NAMED_H_

#include <string>

#include "absl/status/statusor.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"
#include "lib/formats/hf/hf_family.h"

namespace reshard {

// The training-state value (a string: "llama", ...) PresentHfNamedModel sets: the model is a
// training save under Hugging Face names, checked as that family.
inline constexpr char kHfNamedFamilyKey[] = "hf_named.family";

// What a training save under Hugging Face names is, once checked.
struct HfNamedModel {
  const HfFamily* family = nullptr;
  std::string prefix;       // the wrapper prefix stripped: "", "module.", "model.", ...
  std::string config_path;  // the config.json the names and shapes were checked against
};

// Reads the config.json of training save `input` (or `hf.config_file`) and checks the tensors
// of `catalog` against the family (`hf.family`, or config.json's), as the file comment says.
// Reads no tensor data.
absl::StatusOr<HfNamedModel> ReadHfNamedModel(const std::string& input,
                                              const HfExportOptions& hf, const Catalog& catalog);

// HfOutput::PresentInput for a training save under Hugging Face names (IsHfNamedTrainingFormat):
// ReadHfNamedModel, then `catalog`'s tensors renamed without the wrapper prefix,
// `model.training_state` given kHfNamedFamilyKey and `model.description` the family and
// config.json read; true. False, changing nothing, for any other input.
absl::StatusOr<bool> PresentHfNamedModel(const std::string& input, const HfExportOptions& hf,
                                         InputModel& model, Catalog& catalog);

// "Hugging Face llama model (config.json: /ckpt/checkpoint-500/config.json; wrapper prefix
// \"module.\" stripped)": how descriptions name a checked model.
std::string DescribeHfNamedModel(const HfNamedModel& named);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_HF_NAMED_H_
