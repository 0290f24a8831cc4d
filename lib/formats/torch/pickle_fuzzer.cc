// libFuzzer target: the safe pickle reader must never crash, hang, run out of memory or read out
// of bounds on any input; persistent ids resolve to one fixed value, as torch storages would.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "lib/formats/torch/pickle.h"

namespace {

// Bounded walk over the result (values may be shared or cyclic through the memo).
void Touch(const reshard::PickleValue* value, int depth, int* budget) {
  if (value == nullptr || depth > 64 || --*budget < 0) return;
  (void)reshard::DescribePickleValue(value);
  for (const reshard::PickleValue* item : value->items) Touch(item, depth + 1, budget);
  for (const auto& [key, item] : value->entries) {
    Touch(key, depth + 1, budget);
    Touch(item, depth + 1, budget);
  }
  Touch(value->callable, depth + 1, budget);
  Touch(value->args, depth + 1, budget);
  Touch(value->state, depth + 1, budget);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  reshard::PickleArena arena;
  reshard::PickleValue* fixed = arena.New(reshard::PickleValue::Kind::kPersistent);
  fixed->text = "0";
  reshard::PersistentLoad load =
      [fixed](reshard::PickleValue* pid,
              reshard::PickleArena&) -> absl::StatusOr<reshard::PickleValue*> {
    if (pid == nullptr) std::abort();
    return fixed;
  };
  reshard::PickleLimits limits;
  limits.max_values = 1'000'000;  // libFuzzer's RSS limit is 2 GiB
  limits.max_bytes = 8 << 20;      // small bombs among the seeds reach it
  auto result = reshard::ParsePickle(bytes, arena, load, limits);
  if (!result.ok()) {
    if (result.status().message().empty()) std::abort();
    return 0;
  }
  if (*result == nullptr) std::abort();
  int budget = 100000;
  Touch(*result, 0, &budget);
  return 0;
}
