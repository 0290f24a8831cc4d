// Megatron-Core distributed checkpoints in the `torch_dist` backend (id "megatron-torch-dist"),
// as megatron/core/dist_checkpointing saves them, read as one consolidated model.
//
// The checkpoint folder (`iter_0000100/` or `release/` in Megatron-LM, `weights/` in NeMo 2):
//   metadata.json    {"sharded_backend": "torch_dist", "sharded_backend_version": 1, ...};
//                    written last, so a folder without it is an unfinished save
//   .metadata        a PyTorch DCP checkpoint (dcp_format.h): each ShardedTensor is one DCP
//   __R_N.distcp     tensor under its `key`, its shards the chunks; each ShardedObject a bytes
//                    item `<key>/shard_<offsets>_<shape>`
//   common.pt        (older versions) torch.save of the common, non-sharded state; newer ones
//                    keep it as the `common_state` item inside the DCP checkpoint
// or its save folder, whose latest_checkpointed_iteration.txt (or --tag) names the iteration.
//
// Homogeneous transformer layers are saved layer-stacked: TransformerBlock renames
// `layers.<i>.<rest>` to `layers.<rest>` and prepends an axis over all layers of the model
// (pipeline stages included), so `decoder.layers.self_attention.linear_qkv.weight` is a
// [num_layers, 3h, h] tensor whose chunks are one layer's tensor-parallel shards. reshard
// unstacks that axis: every tensor whose name has a `layers` component followed by a
// non-numeric one becomes num_layers tensors `<prefix>layers.<i>.<rest>` (the chunks' boxes
// sliced along it, read in place); all such tensors must agree on num_layers. Per-layer keys
// (heterogeneous stacks: `layers.<i>.`) and every other tensor keep their names.
//
// Mixture-of-experts layers: Megatron-Core's SequentialMLP, TEGroupedMLP (whose keys match it)
// and GroupedMLP save each expert tensor under one key with a global expert axis after the
// layer axis, `decoder.layers.mlp.experts.experts.linear_fc1.weight` [L, E, ...]
// (`...mlp.experts.local_experts.<rest>` is read alike, and a per-layer key
// `decoder.layers.<i>.mlp.experts.experts.<rest>` [E, ...] has it first); its chunks hold one
// expert each (SequentialMLP: offset ep_rank * E_local + l) or an EP rank's E_local experts
// (GroupedMLP). reshard unstacks that axis too: expert e of layer i becomes
// `decoder.layers.<i>.mlp.experts.local_experts.<e>.<rest>`, the name the megatron reader gives a
// legacy save's experts (global ids), so --format hf (Mixtral) and megatron-torch-dist read it
// alike; with singleton_local_shards, `...mlp.experts.experts.<g>.<rest>` is renamed to the same
// name (DataLoss when an id below the largest has no key). Before anything else is read, the
// chunks of each expert key must hold every expert exactly once (CheckExpertChunks,
// torch_dist_experts.h, which also parses these key forms): DataLoss naming `.metadata`,
// the key and the expert when an expert is missing (no chunk, or not all of it) or stored twice
// (the two chunks, their files and byte offsets). All expert keys must agree on E, and
// args.num_experts when the args give it. inspect names the experts and the EP
// (args.expert_model_parallel_size, or the number of sets of files holding the experts).
//
// Non-tensor values are carried as the DCP reader carries them (ShardedObjects and
// `common_state` under their keys); common.pt's contents under "common", and its args,
// iteration and checkpoint_version as the training state "megatron.args", "megatron.iteration"
// and "megatron.checkpoint_version" (megatron_format.h's names; a release/ folder sets
// "megatron.release", and without an iteration in common.pt an iter_ folder's name gives it);
// inspect notes the args as carried to --format hf, megatron and megatron-torch-dist. The
// partition rules (InputModel::default_rules) are Megatron's (MegatronPartitionRules, which
// name Megatron-Core's tensors too): SwiGLU when fc1 is twice as tall as fc2 is wide, QKV in
// whole query groups from the args, so reshard needs no --rules. Refused before
// anything is written, naming what is missing: a folder without metadata.json, a backend other
// than torch_dist (zarr), a missing `.metadata` or data file, and everything the DCP reader
// refuses. `inspect` names the layout ("Megatron-Core torch_dist, iter_0000100, 2 layers
// unstacked from 9 layer-stacked tensors[, 8 experts per layer (EP 2 from the args) unstacked
// from 2 expert-stacked keys]; PyTorch DCP, 2 ranks ...").

#ifndef RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_FORMAT_H_
#define RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"

namespace reshard {

inline constexpr char kTorchDistMetadataName[] = "metadata.json";
inline constexpr char kTorchDistCommonName[] = "common.pt";

class TorchDistInput : public InputFormat {
 public:
  static constexpr char kId[] = "megatron-torch-dist";
  absl::string_view id() const override { return kId; }
  // A folder with metadata.json, an iter_* / release folder with DCP files or common.pt but no
  // metadata.json (an unfinished save, which Read refuses), or a save folder whose tracker
  // names one.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Above Megatron-LM (40), whose save folders look the same, and plain DCP (30), whose files
  // a torch_dist folder holds.
  int probe_priority() const override { return 45; }
  // Its DCP checkpoint as DcpInput reads it; metadata.json and common.pt by range reads.
  // options.tag picks the iteration folder inside a save folder.
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

// Unstacks the layer axis of `catalog`'s layer-stacked tensors in place (see above), renaming
// their leaves in its structure. Returns the number of layers (0 when nothing is stacked).
// DataLoss naming the tensors when two disagree on the number of layers; InvalidArgument when
// an unstacked name is taken by another tensor.
absl::StatusOr<int64_t> UnstackLayers(Catalog& catalog, int64_t* stacked_tensors = nullptr);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_FORMAT_H_
