// libFuzzer target: any pickle must be refused or read as OLMo flat parameter state without
// crashing: the global check, and ParseFlatParamHandle on the root, on its entries and on every
// handle of its "modules" (LocalShardedCheckpointer's layout), whose slices must lie inside the
// shard and whose ranges go through the tiling check.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/formats/fsdp/dtensor.h"
#include "lib/formats/fsdp/flat_param.h"
#include "lib/formats/fsdp/state_dict_fuzz.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace {

constexpr int64_t kFlatNumel = 1 << 16;

void VisitHandle(const reshard::PickleValue* handle) {
  absl::StatusOr<std::vector<reshard::FlatParamSlice>> slices =
      reshard::ParseFlatParamHandle(handle, kFlatNumel);
  if (!slices.ok()) return;
  std::vector<reshard::FlatRange> ranges;
  for (const reshard::FlatParamSlice& s : *slices) {
    if (s.begin < 0 || s.end <= s.begin || s.offset_in_shard < 0 ||
        s.offset_in_shard + (s.end - s.begin) > kFlatNumel) {
      std::abort();
    }
    ranges.push_back(reshard::FlatRange{s.begin, s.end, 0, s.offset_in_shard, 0});
  }
  (void)reshard::CheckFlatRangesTile(ranges, kFlatNumel,
                                     [](const reshard::FlatRange&) { return std::string(); });
}

void Visit(const reshard::PickleValue* value) {
  VisitHandle(value);
  const auto* modules = reshard::PickleItems(reshard::PickleField(value, "modules"));
  if (modules == nullptr) return;
  for (const reshard::PickleValue* module : *modules) {
    const auto* handles = reshard::PickleItems(reshard::PickleField(module, "handles"));
    if (handles == nullptr) continue;
    for (const reshard::PickleValue* handle : *handles) VisitHandle(handle);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  reshard::FuzzStateDictPickle(
      data, size,
      [](const reshard::PickleValue* root) {
        return reshard::CheckPickleGlobals(root, reshard::IsFlatParamGlobal,
                                           "OLMo's flat parameter state");
      },
      Visit);
  return 0;
}
