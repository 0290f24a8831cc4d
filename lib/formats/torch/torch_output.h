// Writes PyTorch checkpoints that torch.load accepts, including weights_only=True and
// mmap=True: the zip layout of torch.save (stored records whose payloads start 64-byte aligned
// behind an "FB" padding field, data descriptors, ZIP64 end records, real CRC-32s) and a
// protocol-2 pickle of only the opcodes and globals weights_only allows.
//
// A file that holds the whole model under the input's names reproduces the input's nesting
// ({"model": {...}, "optimizer": {...}, "step": 10}); otherwise it holds an OrderedDict of its
// tensors. A nesting that carries Python objects (StructureNode kGlobal and kObject: a
// Megatron `args` Namespace, a loss scaler) is written with them, verbatim; such a file needs
// torch.load(weights_only=False), as its input did. Tied weights share one storage. Consolidated
// shards are `pytorch_model-0000i-of-0000N.bin` + `pytorch_model.bin.index.json` (one file:
// `pytorch_model.bin`); parts are `model_part-{rank}.pt`. The records `.format_version` and
// `.storage_alignment` are not written, so torch reads every offset from the headers.

#ifndef RESHARD_LIB_FORMATS_TORCH_TORCH_OUTPUT_H_
#define RESHARD_LIB_FORMATS_TORCH_TORCH_OUTPUT_H_

#include <string>
#include <utility>
#include <vector>

#include "lib/formats/format.h"

namespace reshard {

class TorchOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "torch";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override;
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;
};

// A pickle (protocol 2) of `node`, a value without tensors (a config, an optimizer's
// param_groups), as torch output writes the non-tensor values of a checkpoint: pickle.loads
// gives the value back. InvalidArgument naming the tensor when `node` holds one.
absl::StatusOr<std::string> PickledValueBytes(const StructureNode& node);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_TORCH_OUTPUT_H_
