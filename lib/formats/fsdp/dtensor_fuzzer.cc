// libFuzzer target: any pickle must be refused or read as a DTensor state dict without
// crashing: the global check, the DTensor parser on the root and on every entry, and the box of
// every parsed DTensor's last rank.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "absl/strings/string_view.h"
#include "lib/formats/fsdp/dtensor.h"
#include "lib/formats/fsdp/state_dict_fuzz.h"
#include "lib/formats/torch/pickle.h"

namespace {

void Visit(const reshard::PickleValue* value) {
  absl::StatusOr<std::optional<reshard::DTensorValue>> dtensor = reshard::ParseDTensor(value);
  if (!dtensor.ok() || !dtensor->has_value()) return;
  const reshard::DTensorValue& d = **dtensor;
  // A mesh of 2 ranks per dimension, its last rank.
  if (d.placements.size() > 8) return;
  const reshard::Shape mesh(d.placements.size(), 2);
  const int64_t world = int64_t{1} << d.placements.size();
  absl::StatusOr<reshard::Box> box =
      reshard::DTensorLocalBox(d.global_shape, d.placements, mesh, world, world - 1);
  if (box.ok()) {
    for (size_t i = 0; i < box->extent.size(); ++i) {
      if (box->extent[i] < 0 || box->origin[i] < 0 ||
          box->origin[i] + box->extent[i] > d.global_shape[i]) {
        std::abort();
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  reshard::FuzzStateDictPickle(data, size, reshard::CheckDTensorStateDictGlobals, Visit);
  return 0;
}
