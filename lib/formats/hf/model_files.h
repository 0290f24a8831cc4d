// The files of a Hugging Face model beside its weights (config, generation config, tokenizer,
// model card, licence), and how a conversion carries them into its output.
//
// A folder `save_pretrained` wrote holds the weights (model.safetensors, or sharded
// model-00001-of-0000N.safetensors with model.safetensors.index.json, or pytorch_model*.bin)
// and a config.json; without the files beside them an output is not a model transformers
// loads. FindModelFiles lists those files in an input that is such a folder, FindTokenizerFiles
// the tokenizer files of any folder (`--tokenizer DIR`), and AddModelFiles puts them into a
// conversion's output: every file through the normal commit (listed in the manifest with size
// and XXH3-64; nothing under the output before it is published), small ones as companion files
// and the others as verbatim copies the executor streams within its window.
//
// Files are read through the storage layer (lib/io/file_access.h): local folders, s3:// and
// mem:// prefixes alike, under the thread's path confinement. Symlinks exist on posix only: a
// file whose resolved path leaves the folder is refused (PermissionDenied naming the link and
// its target), except into the blobs of the same Hugging Face cache repository (a folder
// `models--org--name/snapshots/<rev>` whose files link to `../../blobs/<hash>`).

#ifndef RESHARD_LIB_FORMATS_HF_MODEL_FILES_H_
#define RESHARD_LIB_FORMATS_HF_MODEL_FILES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"
#include "lib/plan/layout_builders.h"

namespace reshard {

// One file to carry: its name in the output and in its folder, and where it is read from.
struct ModelFile {
  std::string name;  // "tokenizer.json"
  std::string path;  // the folder's path + "/" + name, as the storage layer reads it
  uint64_t size = 0;
  // A member of an archive (EmbeddedModelFile): the file is bytes [offset, offset + size) of
  // `path`, always carried as a verbatim copy of that range.
  bool in_archive = false;
  uint64_t offset = 0;
  std::string member;  // in_archive: its name in the archive, for messages
};

// Whether `name` is a model file carried beside the weights: config.json,
// generation_config.json, preprocessor_config.json, a tokenizer file (IsTokenizerFileName),
// README.md, USE_POLICY.md, and LICENSE* (LICENSE, LICENSE.txt, ...).
bool IsModelFileName(absl::string_view name);

// Whether `name` is a weight file or index `save_pretrained` writes: model.safetensors,
// model-*-of-*.safetensors, model.safetensors.index.json (safetensors), pytorch_model.bin,
// pytorch_model-*-of-*.bin, pytorch_model.bin.index.json (torch.save, safe_serialization=False).
bool IsHuggingFaceWeightName(absl::string_view name);

// Whether `model` is one model whose files are all save_pretrained's weight files of its format
// (safetensors: model*.safetensors; torch: pytorch_model*.bin): a Hugging Face model folder.
bool IsSavePretrainedModel(const InputModel& model);

// "Hugging Face model folder (torch.save files)", "... (safetensors files)": how `inspect`
// names a model IsSavePretrainedModel accepts; empty for any other.
std::string SavePretrainedFormatName(const InputModel& model);

// Whether `name` is a tokenizer file: tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, vocab.txt,
// added_tokens.json, chat_template.jinja, chat_template.json.
bool IsTokenizerFileName(absl::string_view name);

// The model files of input `input` (a folder or a file, as the user gave it) when it is a
// Hugging Face folder: a folder holding config.json and Hugging Face weight files
// (model.safetensors, model-*-of-*.safetensors, model.safetensors.index.json,
// pytorch_model.bin, pytorch_model-*-of-*.bin, pytorch_model.bin.index.json), or one such
// weight file in that folder. Sorted by name; empty when the input is no such folder. Errors:
// the folder cannot be listed, or a file links out of it (see the file comment).
absl::StatusOr<std::vector<ModelFile>> FindModelFiles(const std::string& input);

// The tokenizer files (IsTokenizerFileName) directly inside folder `dir`, sorted by name, for
// `--tokenizer DIR` and for output formats that write a Hugging Face model from another
// checkpoint (they carry what this returns, with AddModelFiles). Any storage; same symlink
// rule as FindModelFiles. NotFound naming `dir` and the names looked for when it holds none;
// InvalidArgument when `dir` is not a folder.
absl::StatusOr<std::vector<ModelFile>> FindTokenizerFiles(const std::string& dir);

// The tokenizer files beside Megatron checkpoint `input` (its save folder, or one iteration's
// folder iter_NNNNNNN or release), which `--format hf` carries: those (IsTokenizerFileName) of
// the first of these folders that holds any: the folder given, its tokenizer/ subfolder, and for
// an iteration's folder the save folder above it and its tokenizer/. Empty when none does or
// `input` is not a folder. A file linking out of the save folder is refused as in
// FindModelFiles.
absl::StatusOr<std::vector<ModelFile>> FindCheckpointTokenizerFiles(const std::string& input);

// Whether input of `input_format` is a training save whose tensors carry a model's own names
// (Hugging Face's, when a transformers model was trained): deepspeed-zero (HF Trainer +
// DeepSpeed) and torch-dcp (HF Trainer / accelerate + FSDP). `--format hf` writes such a model
// (hf_named.h).
bool IsHfNamedTrainingFormat(absl::string_view input_format);

// The model files (IsModelFileName) beside training save `input` (IsHfNamedTrainingFormat):
// those of the folder given when it holds config.json, else of the folder above it when that
// is an HF Trainer checkpoint folder, `checkpoint-<N>` (which holds the weights' folder:
// DeepSpeed's `global_stepN/`, FSDP's `pytorch_model_fsdp_0/`), else none. Never higher, and
// never the parent of another folder. Sorted by name; `looked_in` (when not null) receives the
// folders looked in, for messages. A file linking out of its folder is refused as in
// FindModelFiles.
absl::StatusOr<std::vector<ModelFile>> FindTrainingSaveModelFiles(
    const std::string& input, std::vector<std::string>* looked_in = nullptr);

// Whether an output in `output_format` is still a Hugging Face model the carried files belong
// beside: safetensors (consolidated, or parts), hf, and torch when consolidated
// (pytorch_model.bin, or pytorch_model-*-of-*.bin with its index). torch parts are metaseq's
// layout; the training formats are not Hugging Face models.
bool OutputIsHuggingFaceModel(absl::string_view output_format, bool consolidate);

// The model files of input `input` read as `input_format`: FindModelFiles for a safetensors or
// torch input (the formats save_pretrained writes), the model files (IsModelFileName) of the
// `huggingface/` folder of a verl-fsdp input, none for the others. What `inspect` lists.
absl::StatusOr<std::vector<ModelFile>> InputModelFiles(const std::string& input,
                                                       absl::string_view input_format);

// What a conversion carries beside the weights: the model files of its input
// (InputModelFiles) unless `no_extra_files`, with the tokenizer files of folder `tokenizer`
// (when not empty) over them; nothing when the output is not a Hugging Face model
// (OutputIsHuggingFaceModel). A Megatron input (megatron, megatron-torch-dist) carries into
// `--format hf` only: the tokenizer of folder `tokenizer`, else, unless `no_extra_files`, the
// one beside the checkpoint (FindCheckpointTokenizerFiles). A NeMo input (nemo) likewise, its
// own tokenizer being the reader's `embedded` files (a `.nemo` archive's tokenizer members) or
// the tokenizer files of a NeMo 2 folder's context/nemo_tokenizer/. A training save under
// Hugging Face names (IsHfNamedTrainingFormat) carries into `--format hf` only: the model files
// found beside it (FindTrainingSaveModelFiles; with `no_extra_files` its config.json and
// generation_config.json only), the tokenizer of folder `tokenizer` over them. InvalidArgument when
// `tokenizer` is given for an output that is no Hugging Face model.
absl::StatusOr<std::vector<ModelFile>> ModelFilesToCarry(
    const std::string& input, absl::string_view input_format, absl::string_view output_format,
    bool consolidate, bool no_extra_files, const std::string& tokenizer,
    const std::vector<EmbeddedModelFile>& embedded = {});

// config.json `config` (read from `path`, for messages) with "torch_dtype" and "dtype"
// (transformers 5 writes the latter) set to the torch name of `dtype` ("bfloat16", ...): the
// keys present are updated, "torch_dtype" is added when neither is; every other key is kept
// with its value, in its order. Written as transformers writes it (2-space indent, a newline
// at the end). kKeep returns `config` unchanged. DataLoss naming `path` when it is not a JSON
// object.
absl::StatusOr<std::string> UpdateConfigDtype(absl::string_view config, absl::string_view path,
                                              DTypePolicy dtype);

// Files up to this size are carried as companion files (read whole while planning); larger
// ones as verbatim copies, which the executor streams within the conversion's window.
inline constexpr uint64_t kModelFileCompanionBytes = 1 << 20;
// config.json is edited in memory (UpdateConfigDtype): larger is ResourceExhausted.
inline constexpr uint64_t kMaxConfigBytes = 16 << 20;

// Adds `files` to a conversion's output: config.json (its dtype updated for `dtype`) and
// files up to kModelFileCompanionBytes appended to `companions` as (name, contents), larger
// ones and archive members to `arranged` as verbatim copies (AddVerbatimCopy,
// AddVerbatimRangeCopy). A file whose name the output
// already has (a layout file, a companion: an output format's own config.json) is left out.
absl::Status AddModelFiles(const std::vector<ModelFile>& files, DTypePolicy dtype,
                           const Catalog& catalog, ArrangedOutput& arranged,
                           std::vector<std::pair<std::string, std::string>>& companions);

// Merges the files of `extra` into `files`: an `extra` file replaces one of the same name
// (`--tokenizer DIR` over the input's own tokenizer). Sorted by name.
std::vector<ModelFile> MergeModelFiles(std::vector<ModelFile> files, std::vector<ModelFile> extra);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_MODEL_FILES_H_
