// OLMo's safetensors files (olmo/safetensors_util.py, state_dict_to_safetensors_file and
// safetensors_file_to_state_dict), read and written as id "olmo-safetensors".
//
// OLMo stores a nested state dict (the model's, or the optimizer's with its int-keyed `state`
// and pickled `param_groups`) in one ordinary safetensors file whose entry names are encoded
// key paths (olmo_keys.h): a tensor sits under base64(pickle((keys, False))), any other value
// under base64(pickle((keys, True))) as `pickle.dumps(value)` in a 1-d uint8 tensor. Lists are
// not recursed into: they are pickled whole.
//
// Reading (`OlmoSafetensorsInput`): a `.safetensors` file whose entry names are such keys, or a
// folder of them (OLMo's unsharded checkpoint: model.safetensors, optim.safetensors), read as
// one model when their names are disjoint. The header is validated as for any safetensors file;
// every name is decoded (a name that is not OLMo's encoding is an error naming the file, the
// name and the header's byte range); tensors become Catalog tensors named by their dotted key
// path ("optim.state.0.exp_avg", as the torch reader names nested state dicts), located in
// place; pickled values run through the safe pickle reader (never executed) and become the
// non-tensor leaves of Catalog::structure, which rebuilds OLMo's nested dict, so torch output
// writes the state dict OLMo's loader returns.
//
// Writing (`OlmoSafetensorsOutput`, --format olmo-safetensors): one `model.safetensors` for a
// consolidation (whatever --max-shard-size says: OLMo reads one file per state dict), parts
// `model_part-{rank}.safetensors`. The input's nesting is flattened as OLMo's flatten_dict
// does: dicts are recursed (str and int keys), tensors are stored under their key path, every
// other value (lists, tuples, numbers, strings, objects carried from a torch input) is pickled
// whole into a uint8 entry; a tensor inside such a value cannot be (Unimplemented naming it).
// Without a nesting (a flat input) every tensor is stored under the key path (name,), as OLMo's
// model state dicts are. Tied weights are stored once per name (safetensors.torch.save_file
// refuses shared tensors, and OLMo's loader knows no aliases). Entries are ordered as the
// safetensors writer orders them (dtype descending, then name); no `__metadata__` is written,
// as OLMo writes none. Tensor data streams through the engine like any other output.

#ifndef RESHARD_LIB_FORMATS_OLMO_OLMO_FORMAT_H_
#define RESHARD_LIB_FORMATS_OLMO_OLMO_FORMAT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"

namespace reshard {

class OlmoSafetensorsInput : public InputFormat {
 public:
  static constexpr char kId[] = "olmo-safetensors";
  absl::string_view id() const override { return kId; }
  // A safetensors file (or a folder holding one) with an entry name that is OLMo's encoding.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // A safetensors file recognized by its entry names: before generic safetensors.
  int probe_priority() const override { return 15; }
  // s3:// too: its header and pickled values by range reads (read as plain safetensors, its
  // encoded names would pass for tensor names).
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

class OlmoSafetensorsOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "olmo-safetensors";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override;
  // One file for a consolidation; tied aliases written in full.
  absl::StatusOr<ArrangedOutput> Arrange(TargetLayout engine_layout,
                                         const ArrangeRequest& request) const override;
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_OLMO_OLMO_FORMAT_H_
