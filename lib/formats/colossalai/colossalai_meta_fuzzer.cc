// libFuzzer target: a ColossalAI metadata file must be parsed (or refused) without crashing,
// and every accepted box must lie inside its global shape; the hole finder must return a box
// inside the tensor that the parameter's box does not touch.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "lib/formats/colossalai/colossalai_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view json(reinterpret_cast<const char*>(data), size);
  auto meta = reshard::ParseColossalMeta(json, "fuzz/pytorch_model-meta-dist-00000.json", 0);
  if (!meta.ok()) return 0;
  for (const reshard::ColossalParam& param : meta->params) {
    const reshard::Box& box = param.box;
    if (box.rank() != param.global_shape.size()) std::abort();
    for (size_t d = 0; d < box.rank(); ++d) {
      if (box.origin[d] < 0 || box.extent[d] < 0 ||
          box.origin[d] + box.extent[d] > param.global_shape[d]) {
        std::abort();
      }
    }
    auto hole = reshard::FindUncoveredBox(param.global_shape, {box}, 4096);
    if (!hole.has_value()) continue;
    if (hole->rank() != box.rank()) std::abort();
    // A box with no elements (a zero length, as an uneven split can give a rank) is disjoint
    // from every hole; a 0-d box holds the one element and leaves no hole.
    bool disjoint = box.rank() == 0;
    for (size_t d = 0; d < box.rank(); ++d) disjoint |= box.extent[d] == 0;
    for (size_t d = 0; d < box.rank(); ++d) {
      if (hole->origin[d] < 0 || hole->extent[d] <= 0 ||
          hole->origin[d] + hole->extent[d] > param.global_shape[d]) {
        std::abort();
      }
      disjoint |= hole->origin[d] + hole->extent[d] <= box.origin[d] ||
                  box.origin[d] + box.extent[d] <= hole->origin[d];
    }
    if (!disjoint) std::abort();
  }
  return 0;
}
