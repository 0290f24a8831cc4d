// The expert axis of Megatron-Core torch_dist checkpoints (torch_dist_format.h): the key forms
// a mixture-of-experts layer's experts are saved under, and the check, made on `.metadata`
// before any data is read, that the chunks of each expert key hold every expert exactly once.
//
// Megatron-Core's SequentialMLP, TEGroupedMLP (whose keys match it) and GroupedMLP save each
// expert tensor under one key with a global expert axis after the layer axis:
//   decoder.layers.mlp.experts.experts.linear_fc1.weight        [L, E, ...]  layer-stacked
//   decoder.layers.mlp.experts.local_experts.linear_fc1.weight  [L, E, ...]  the same, spelled so
//   decoder.layers.<i>.mlp.experts.experts.linear_fc1.weight    [E, ...]     per-layer key
//   decoder.layers.mlp.experts.experts.<g>.linear_fc1.weight    [L, ...]     one key per expert g
//                                                                            (singleton_local_shards)
// The chunks of an expert-axis key hold one expert each (SequentialMLP: offset
// ep_rank * E_local + l) or an EP rank's E_local experts (GroupedMLP).

#ifndef RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_EXPERTS_H_
#define RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_EXPERTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "lib/formats/dcp/dcp_metadata.h"

namespace reshard {

// A layer-stacked name split around its `layers` component: "decoder.layers.mlp.fc1.weight"
// -> ("decoder.layers.", "mlp.fc1.weight"); nullopt when the name has no `layers` component
// followed by a non-numeric one.
std::optional<std::pair<std::string, std::string>> SplitLayerStacked(absl::string_view name);

// A key of a mixture-of-experts layer's experts in one of the forms above:
// `<experts>.experts.<rest>` (or `<experts>.local_experts.<rest>`) with a global expert axis,
// `<experts>` = "...mlp.experts" and <rest> not starting with an index; or, with
// singleton_local_shards, `<experts>.experts.<g>.<rest>` (`expert` = g).
struct TorchDistExpertKey {
  std::string experts;
  std::string rest;
  int64_t expert = -1;  // the singleton form's global id; -1: the key has an expert axis
};

// The key `name` is, or nullopt when it is none of an expert's (`...local_experts.<l>.*`, a
// legacy save's one-expert name, included).
std::optional<TorchDistExpertKey> ParseTorchDistExpertKey(absl::string_view name);

// The name reshard gives expert `expert` of `key`: SequentialMLP's per-expert name with the
// global id ("<experts>.local_experts.<expert>.<rest>"), as the megatron reader gives a legacy
// save's experts.
std::string TorchDistExpertName(const TorchDistExpertKey& key, int64_t expert);

// `name` without the layer index after its `layers` component: the checkpoint key of a layer's
// tensor ("decoder.layers.3.mlp.x" -> "decoder.layers.mlp.x").
std::string WithoutLayerIndex(absl::string_view name);

// Checks that the chunks of every expert-axis tensor of `metadata` (the `.metadata` at
// `metadata_path` of the checkpoint folder `dir`) hold each of its experts exactly once, before
// DCP's check of the whole tensor (ReadDcpCheckpoint's check parameter), so that a refusal
// names the expert, the key and the files. DataLoss naming `metadata_path`, the key and the
// expert: missing (its chunks do not cover it: none, or how many of its elements they hold), or
// stored twice (two chunks overlap within it: both chunks, their files and byte offsets); a
// chunk of another rank than its tensor's or outside it (the chunk, its file and byte offset and
// the experts it claims); more than kMaxMegatronIndex experts. Metadata too large to check
// expert by expert is left to DCP's tiling check.
absl::Status CheckExpertChunks(const std::string& dir, const DcpMetadata& metadata,
                               const std::string& metadata_path);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_EXPERTS_H_
