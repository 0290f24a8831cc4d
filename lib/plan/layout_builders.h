// Builders of target layouts and the merge of model-parallel parts into one Catalog.

#ifndef RESHARD_LIB_PLAN_LAYOUT_BUILDERS_H_
#define RESHARD_LIB_PLAN_LAYOUT_BUILDERS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/plan/layout.h"
#include "lib/plan/partition_rules.h"

namespace reshard {

// Output dtype requested for floating tensors (`--dtype`).
enum class DTypePolicy { kKeep, kF32, kBF16, kF16 };

// Parses "keep", "fp32", "bf16", "fp16" (also "float32", "bfloat16", "float16", "f32", ...).
absl::StatusOr<DTypePolicy> ParseDTypePolicy(absl::string_view text);
absl::string_view DTypePolicyName(DTypePolicy policy);

// The dtype a tensor stored as `dtype` gets under `policy`: F32/F16/BF16 become the requested
// float type; every other dtype is kept.
DType ApplyDTypePolicy(DTypePolicy policy, DType dtype);

// Parses a shard size: plain bytes, or a number with KB/MB/GB/TB (decimal, as Hugging Face
// counts) or KiB/MiB/GiB/TiB (binary). "5GB" = 5,000,000,000.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// One model, split into files of at most `max_shard_size` bytes with Hugging Face's rule:
// tensors in Catalog order; a tensor larger than the limit goes alone into a file of its own
// (appended at once); otherwise a new file starts when the current one would overflow.
// Tied weights (FindAliases) are stored once when `dedupe_tied`: the alias goes into the file
// of the tensor it aliases, marked `alias_of`, and does not count towards the file's size
// (Hugging Face places shared tensors the same way). Otherwise every name gets its own copy.
// The tensors, in their order, packed into files of at most `max_shard_size` bytes with Hugging
// Face's rule (below): a tensor larger than the limit alone in a file of its own; otherwise a
// new file starts when the current one would overflow. At least one (possibly empty) file.
std::vector<std::vector<OutputTensor>> PackShards(std::vector<OutputTensor> tensors,
                                                  uint64_t max_shard_size);

absl::StatusOr<TargetLayout> BuildConsolidateLayout(const Catalog& catalog, DTypePolicy dtype,
                                                    uint64_t max_shard_size,
                                                    const OutputNaming& naming,
                                                    bool dedupe_tied = true);

// `parts` tensor-parallel parts, one file each: tensors with a split rule are cut into `parts`
// equal slices along the rule's dimension (which must divide evenly); replicated ones are whole
// in every part; fused ones (rule `fused` K) get their slice of each of the K blocks, which
// needs `catalog` to come from ViewFusedTensors.
absl::StatusOr<TargetLayout> BuildSplitLayout(const Catalog& catalog, const PartitionRules& rules,
                                              int parts, DTypePolicy dtype,
                                              const OutputNaming& naming);

// The Catalog with every tensor whose rule is fused (K blocks along its split dimension d)
// viewed as shape [..., K, size/K, ...]: pieces are cut at block boundaries. BuildSplitLayout
// needs this view to give each part its slice of every block. Other tensors are unchanged.
absl::StatusOr<Catalog> ViewFusedTensors(const Catalog& catalog, const PartitionRules& rules);

// `tensor` with dimension `dim` viewed as [blocks, size / blocks]: the same elements in the
// same order, its pieces cut at block boundaries (no data is read). Views of views split a
// dimension further: a fused QKV [ng * (r + 2) * d, h] viewed at dim 0 by ng, then at dim 1 by
// r + 2, is [ng, r + 2, d, h]. InvalidArgument naming the tensor when `blocks` does not divide
// the dimension.
absl::StatusOr<CatalogTensor> ViewAsBlocks(const CatalogTensor& tensor, int dim, int64_t blocks);

// `tensor` with its dimensions reordered: dimension d of the view is dimension `order[d]` of
// `tensor`, as torch's `permute(order)` (a 2-D transpose is order {1, 0}). Its pieces keep
// their bytes and take permuted boxes and strides, so a region of the view is a strided gather
// of the source (no data is read here). InvalidArgument naming the tensor unless `order` is a
// permutation of its dimensions.
absl::StatusOr<CatalogTensor> ViewPermuted(const CatalogTensor& tensor,
                                           const std::vector<int>& order);

// `tensor`, whose dimension `dim` holds sub-tensors of `sizes` one after the other (a fused QKV
// [q; k; v]), with the rows of that dimension reordered part by part: [q_0; k_0; v_0; q_1; k_1;
// v_1; ...], x_t being the t-th of `parts` equal slices of x. An even split of the view into
// `parts` along `dim` gives part t its slice of every sub-tensor, [q_t; k_t; v_t]. Pieces (and
// replicas) are cut at the slices' boundaries and moved (no data is read). InvalidArgument
// naming the tensor when `sizes` do not add up to the dimension or `parts` does not divide one.
absl::StatusOr<CatalogTensor> ViewSubTensorsByPart(const CatalogTensor& tensor, int dim,
                                                   const std::vector<int64_t>& sizes, int parts);

// Merges N model-parallel parts (each a Catalog of its local tensors, in rank order) into one
// Catalog of global tensors. Every part must hold the same tensor names. Split tensors are
// concatenated along the rule's dimension in part order; replicated ones must agree in shape
// and dtype, and part 0's copy is used; the other parts' copies become its replicas
// (CatalogTensor::replicas), which `verify` compares byte by byte. Each part's own replicas are
// carried, placed as its pieces are, so that `verify` compares them with the piece of the same
// box (for a replicated tensor, part 0's). `part_names` name the parts in error messages.
absl::StatusOr<Catalog> MergeParts(std::vector<Catalog> parts, const PartitionRules& rules,
                                   const std::vector<std::string>& part_names);

}  // namespace reshard

#endif  // RESHARD_LIB_PLAN_LAYOUT_BUILDERS_H_
