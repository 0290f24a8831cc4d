// How DeepSpeed's ds_to_universal merges the tensor-parallel slices of a parameter, from the
// pattern lists of the model's `universal_checkpoint_info` (Megatron-DeepSpeed's
// UniversalCheckpointInfo; docs/formats.md, "DeepSpeed universal checkpoints"). One
// classification serves both the readers (partition rules that merge TP parts the same way) and
// the universal output (the keys of zero/<param>/*.pt), so the two cannot disagree.
//
// Patterns are Python regexes applied with re.match: anchored at the start of the name only.
// They are compiled with RE2 as "^(?:<pattern>)", which is what they mean for the syntax both
// engines share. Precedence is ds_to_universal's: tp_replicated, parameter_to_average,
// parameter_with_2_sub_params_cat_dim_0, parameter_with_sub_params, parameter_with_row_
// parallelism, else concatenation on dim 0; vocabulary_parameter_patterns apply on top.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_PATTERNS_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_PATTERNS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/plan/partition_rules.h"

namespace re2 {
class RE2;
}

namespace reshard {

// How one parameter's TP slices become the whole tensor.
enum class UcpMerge {
  kReplicated,      // keep slice 0 (no cat_dim key)
  kAverage,         // element-wise mean
  kTwoSubParams,    // halves of each slice, first halves then second (cat_dim 0, 2 sub-params)
  kSubParams,       // fused QKV / GQA sub-param shapes
  kRowParallel,     // concatenation on dim 1
  kColumnParallel,  // concatenation on dim 0 (the default)
};

struct UcpParamRule {
  UcpMerge merge = UcpMerge::kColumnParallel;
  bool vocab = false;  // rows cut to original_vocab_size, key vocab_tensor
};

// One entry of parameter_with_sub_params: DeepSpeed's SubparamShape(patterns, shape,
// partition_dim), saved in universal_checkpoint_info as a dict (dataclasses.asdict). Along
// partition_dim the whole tensor stacks sub-params of `sizes` rows (shape[partition_dim], a
// tuple such as (q_rows, kv_rows, kv_rows), or one int); TP rank r's slice holds rows
// [size / TP * r, size / TP * (r + 1)) of each sub-param, in order. ds_to_universal merges the
// slices into the sub-params one after the other, each the concatenation of its rank pieces.
struct UcpSubParamShape {
  std::vector<int64_t> sizes;
  Shape shape;  // the whole tensor's shape (tuples summed)
  int partition_dim = 0;
  // The SubparamShape object ds_to_universal saves as `sub_param_shape` in zero/<param>/*.pt:
  // deepspeed.checkpoint.universal_checkpoint.SubparamShape with the entry's fields.
  StructureNode saved;
};

class UniversalPatterns {
 public:
  UniversalPatterns();
  UniversalPatterns(UniversalPatterns&&) noexcept;
  UniversalPatterns& operator=(UniversalPatterns&&) noexcept;
  ~UniversalPatterns();

  // The pattern lists of `info` (universal_checkpoint_info as a StructureNode); null or a
  // non-dict: no patterns (every parameter concatenated on dim 0). InvalidArgument naming the
  // list and pattern when one does not compile.
  static absl::StatusOr<UniversalPatterns> FromInfo(const StructureNode* info);

  UcpParamRule Classify(absl::string_view name) const;
  // The parameter_with_sub_params entry whose patterns match `name` first (ds_to_universal's
  // order), or null. Classify says whether that entry decides the merge.
  const UcpSubParamShape* SubParamShape(absl::string_view name) const;
  std::optional<int64_t> original_vocab_size() const { return original_vocab_size_; }
  // Whether `name` matches pipeline_replicated_parameter_patterns (tied embeddings held by the
  // first and the last pipeline stage).
  bool PipelineReplicated(absl::string_view name) const;

  // Partition rules that merge TP parts (and "<param>.exp_avg" / ".exp_avg_sq", which the
  // prefix-anchored patterns match too) as ds_to_universal merges slices, in its precedence:
  // replicated, 2 sub-params (fused: 2 on dim 0), sub-param shapes (concatenation on
  // partition_dim, of slices the reader has regrouped: RegroupSubParams), row-parallel (dim 1),
  // catch-all dim 0. Parameters to average are replicated here (TP rank 0's slice, what a
  // reader of the weights gets); the universal output averages the slices itself.
  std::vector<PartitionRule> MergeRules() const;

 private:
  struct List {
    std::vector<std::string> patterns;
    std::vector<std::unique_ptr<re2::RE2>> compiled;
    bool Matches(absl::string_view name) const;
  };
  static absl::Status AddList(const StructureNode* node, absl::string_view key, List& list);

  struct SubParams {
    List list;
    UcpSubParamShape shape;
  };

  List replicated_, average_, two_sub_, row_, vocab_, pipeline_;
  std::vector<SubParams> sub_params_;
  std::optional<int64_t> original_vocab_size_;
};

// "tp_replicated", "parameter_to_average", ...: the list a merge comes from, for messages.
absl::string_view UcpMergeName(UcpMerge merge);

// Makes concatenating `parts` (the TP ranks' catalogs, in rank order) along
// shape.partition_dim give ds_to_universal's merge of tensor `name`: the rows of each rank's
// slice are regrouped so that part r holds rows [R * r, R * (r + 1)) of the merged tensor (R:
// the rows of one slice), pieces cut where they straddle a sub-param boundary and pointing into
// the other ranks' files where needed (those files are added to the part). Metadata only.
// InvalidArgument naming the tensor when a slice is not shape / TP along partition_dim, or a
// sub-param size is not divisible by TP.
absl::Status RegroupSubParams(std::vector<Catalog>& parts, const std::string& name,
                              const UcpSubParamShape& shape);

// RegroupSubParams of every tensor of parts[0] that `patterns` merges as fused sub-params
// (Classify gives kSubParams), in catalog order. Returns those tensors' names with their
// entries of parameter_with_sub_params (owned by `patterns`), for the readers to record what
// the merged tensors hold.
absl::StatusOr<std::vector<std::pair<std::string, const UcpSubParamShape*>>> RegroupAllSubParams(
    std::vector<Catalog>& parts, const UniversalPatterns& patterns);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_PATTERNS_H_
