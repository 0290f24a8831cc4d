// What the files of a Megatron checkpoint say about the model, and the checks that they agree,
// shared by the Megatron-LM and DeepSpeed pipeline readers: args as Python prints them,
// iteration and checkpoint_version, SwiGLU, the padded vocabulary, tensor names per file, and a
// state dict inside an archive as a Catalog. No file is opened here.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FACTS_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FACTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace megatron_internal {

// Args that make pipeline stages hold unequal numbers of layers.
inline constexpr const char* kUnevenStageArgs[] = {
    "standalone_embedding_stage",         "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",   "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
};

// One arg (or other plain value) as Python would print it; `number` for ints and bools.
struct ArgValue {
  std::string text;
  std::optional<int64_t> number;
};

using ArgMap = std::map<std::string, ArgValue>;

// As Python's repr: 3.0, 0.0001, 1e-08.
std::string FormatFloat(double value);

ArgValue RenderValue(const PickleValue* value);

ArgMap ReadArgs(const PickleValue* args);

std::optional<int64_t> ArgNumber(const ArgMap& args, absl::string_view key);

// Rows of query_key_value that belong to one attention head (with grouped-query attention: one
// head group, its query heads plus one key and one value head), which a tensor-parallel split
// must keep together; 1 when the args do not say.
int64_t QkvUnitRows(const ArgMap& args);

std::optional<double> PickleNumber(const PickleValue* value);

// The tensors of a state dict inside `archive` (nested dicts, as Megatron's
// state_dict_for_save_checkpoint makes them) as a Catalog of one source file, named by their
// dotted key path below `prefix`; plain values are listed in other_entries.
absl::StatusOr<Catalog> StateDictCatalog(const TorchArchive& archive, const PickleValue* value,
                                         const std::string& prefix);

// The plain values of a checkpoint file (iteration, args, ...), for `inspect`; those named in
// `carried` are said to reach the megatron output (InputModel::training_state).
void NoteTopLevel(const PickleValue* root, const std::vector<std::string>& skip,
                  std::vector<std::string>& notes, const std::vector<std::string>& carried = {});

// What two files of one checkpoint must agree on.
struct FileFacts {
  std::string name;  // relative to the checkpoint folder, for messages
  bool has_args = false;
  ArgMap args;
  std::optional<int64_t> iteration;
  std::optional<double> version;
};

FileFacts ReadFacts(const PickleValue* root, std::string name);

// The values of a checkpoint file that a Megatron output writes back (InputModel::
// training_state.values, names in megatron_format.h): "megatron.args" (the Namespace as
// PickleToStructure makes it), "megatron.iteration", "megatron.checkpoint_version", each when
// the file holds it. Args PickleToStructure refuses are not carried; `notes` says why.
std::map<std::string, StructureNode> CarriedValues(const PickleValue* root, const FileFacts& facts,
                                                   std::vector<std::string>& notes);

absl::Status CompareFacts(const FileFacts& reference, const FileFacts& other,
                          absl::string_view what);

// Refuses query_key_value orderings older than Megatron's checkpoint version 2.0.
absl::Status CheckVersion(const FileFacts& facts, absl::string_view what, bool required);

// Whether the model is SwiGLU: args.swiglu when present (checked against the shapes), else the
// shapes.
absl::StatusOr<bool> DecideSwiGLU(const FileFacts& facts, const Catalog& part,
                                  absl::string_view what);

// The rows x TP of word_embeddings and of an untied output_layer (`part`: TP rank 0's merged
// model) must be args.padded_vocab_size: InvalidArgument naming the tensor, its file, its rows
// and both sizes otherwise.
absl::Status CheckPaddedVocab(const FileFacts& facts, const Catalog& part, int tp,
                              absl::string_view what);

// Names of `a` missing from `b`, and the other way round, as an error naming the files.
absl::Status CompareNames(const Catalog& a, const std::string& a_name, const Catalog& b,
                          const std::string& b_name, absl::string_view what);

std::string Topology(absl::string_view framework, int tp, int pp);

}  // namespace megatron_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FACTS_H_
