// libFuzzer target: a torch.save archive opened for metadata (zip + pickle + storage index)
// must never crash, hang or read out of bounds, and every tensor it locates must lie inside
// the input. This is the layer the torch, DeepSpeed ZeRO, Megatron and DCP readers share.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/strings/string_view.h"
#include "lib/core/dtype.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace {

using reshard::PickleValue;

// Checks every value reachable from `value` that is a tensor (bounded: the walk visits each
// value at most once per path, and stops at depth 64).
void CheckTensors(const reshard::TorchArchive& archive, const PickleValue* value, int depth,
                  size_t& budget) {
  if (value == nullptr || depth > 64 || budget == 0) return;
  --budget;
  auto location = archive.Tensor(value, "fuzz");
  if (location.ok() && location->has_value()) {
    const reshard::TensorLocation& t = **location;
    if (t.shape.size() != t.strides.size()) std::abort();
    bool empty = false;
    unsigned __int128 last = 0;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] == 0) empty = true;
      if (t.shape[d] > 0) last += static_cast<unsigned __int128>(t.shape[d] - 1) * t.strides[d];
    }
    if (!empty) {
      const unsigned __int128 end = t.byte_offset + (last + 1) * reshard::DTypeSize(t.dtype);
      if (end > archive.size()) std::abort();
    }
    return;
  }
  for (const PickleValue* item : value->items) CheckTensors(archive, item, depth + 1, budget);
  for (const auto& [key, item] : value->entries) {
    CheckTensors(archive, key, depth + 1, budget);
    CheckTensors(archive, item, depth + 1, budget);
  }
  CheckTensors(archive, value->state, depth + 1, budget);
  CheckTensors(archive, value->args, depth + 1, budget);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto archive = reshard::TorchArchive::Parse(bytes, "fuzz.pt");
  if (!archive.ok()) return 0;
  if ((*archive)->size() != size) std::abort();
  size_t budget = 100000;
  CheckTensors(**archive, (*archive)->root(), 0, budget);
  // The navigation helpers must cope with any value.
  const PickleValue* root = (*archive)->root();
  (void)reshard::PickleField(root, "module");
  (void)reshard::PickleInt(reshard::PickleField(root, "zero_stage"));
  (void)reshard::PickleShape(root);
  return 0;
}
