// libFuzzer target: any pickle must be refused or read as a ShardedTensor state dict without
// crashing: the global check, and the ShardedTensor parser on the root and on every entry, whose
// every parsed shard must lie inside its tensor.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "absl/strings/string_view.h"
#include "lib/formats/fsdp/sharded_tensor.h"
#include "lib/formats/fsdp/state_dict_fuzz.h"
#include "lib/formats/torch/pickle.h"

namespace {

void CheckInside(const reshard::Box& box, const reshard::Shape& shape) {
  if (box.origin.size() != shape.size() || box.extent.size() != shape.size()) std::abort();
  for (size_t i = 0; i < shape.size(); ++i) {
    if (box.extent[i] < 0 || box.origin[i] < 0 || box.origin[i] + box.extent[i] > shape[i]) {
      std::abort();
    }
  }
}

void Visit(const reshard::PickleValue* value) {
  absl::StatusOr<std::optional<reshard::ShardedTensorValue>> st =
      reshard::ParseShardedTensor(value);
  if (!st.ok() || !st->has_value()) return;
  for (const reshard::ShardedTensorShard& shard : (*st)->shards_metadata) {
    CheckInside(shard.box, (*st)->global_shape);
  }
  for (const reshard::ShardedTensorShard& shard : (*st)->local_shards) {
    CheckInside(shard.box, (*st)->global_shape);
    if (shard.rank != (*st)->rank) std::abort();
  }
  (void)reshard::DescribeShards((*st)->shards_metadata);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  reshard::FuzzStateDictPickle(data, size, reshard::CheckShardedTensorStateDictGlobals, Visit);
  return 0;
}
