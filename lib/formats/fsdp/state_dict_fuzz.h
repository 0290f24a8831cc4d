// The body the state dict fuzzers (dtensor_fuzzer, sharded_tensor_fuzzer) share: the fuzz input
// parsed as a pickle whose storages are None, then `check` on the root and `visit` on the root
// and on each of its entries.

#ifndef RESHARD_LIB_FORMATS_FSDP_STATE_DICT_FUZZ_H_
#define RESHARD_LIB_FORMATS_FSDP_STATE_DICT_FUZZ_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {

template <typename Check, typename Visit>
void FuzzStateDictPickle(const uint8_t* data, size_t size, Check check, Visit visit) {
  PickleArena arena;
  PickleLimits limits;
  limits.max_bytes = 64 << 20;
  const PersistentLoad storage = [](PickleValue*, PickleArena& a) -> absl::StatusOr<PickleValue*> {
    return a.New(PickleValue::Kind::kNone);
  };
  absl::StatusOr<PickleValue*> root = ParsePickle(
      absl::string_view(reinterpret_cast<const char*>(data), size), arena, storage, limits);
  if (!root.ok()) return;
  (void)check(*root);
  visit(*root);
  if (const auto* entries = PickleEntries(*root); entries != nullptr) {
    for (const auto& [key, value] : *entries) visit(value);
  }
}

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_STATE_DICT_FUZZ_H_
