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
  std::optional<int64_t> original_vocab_size() const { return original_vocab_size_; }
  // Whether `name` matches pipeline_replicated_parameter_patterns (tied embeddings held by the
  // first and the last pipeline stage).
  bool PipelineReplicated(absl::string_view name) const;

  // Partition rules that merge TP parts (and "<param>.exp_avg" / ".exp_avg_sq", which the
  // prefix-anchored patterns match too) as ds_to_universal merges slices, in its precedence:
  // replicated, 2 sub-params (fused: 2 on dim 0), row-parallel (dim 1), catch-all dim 0.
  // Parameters to average or with sub-param shapes cannot be merged by concatenation: the
  // caller refuses them (Classify) before using these rules.
  std::vector<PartitionRule> MergeRules() const;

 private:
  struct List {
    std::vector<std::string> patterns;
    std::vector<std::unique_ptr<re2::RE2>> compiled;
    bool Matches(absl::string_view name) const;
  };
  static absl::Status AddList(const StructureNode* node, absl::string_view key, List& list);

  List replicated_, average_, two_sub_, sub_params_, row_, vocab_, pipeline_;
  std::optional<int64_t> original_vocab_size_;
};

// "tp_replicated", "parameter_to_average", ...: the list a merge comes from, for messages.
absl::string_view UcpMergeName(UcpMerge merge);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_PATTERNS_H_
