// Partition rules: how each tensor is split across tensor-parallel (model-parallel) parts.
//
// An ordered list of (pattern -> split dimension | replicated). The first rule whose RE2
// pattern is found in a tensor's name decides (search, not full match: anchor with ^ and $).
// A tensor matching no rule is an error, so rule files end with a catch-all when that is meant.
//
// JSON form, loaded from a file:
//   {"rules": [{"pattern": "q_proj\\.weight$", "split_dim": 0},
//              {"pattern": "query_key_value", "split_dim": 0, "unit": 192},
//              {"pattern": ".*", "replicate": true}]}

#ifndef RESHARD_LIB_PLAN_PARTITION_RULES_H_
#define RESHARD_LIB_PLAN_PARTITION_RULES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace re2 {
class RE2;
}

namespace reshard {

struct PartitionRule {
  std::string pattern;
  bool replicate = false;
  int split_dim = 0;  // negative counts from the last dimension
  // The split dimension stacks this many equal blocks, each split across the parts on its own
  // (metaseq's fused qkv_proj: every part holds [q_i; k_i; v_i]). 1: a plain split.
  int fused = 1;
  // The split dimension (each fused block's, with `fused`) is made of units of this many rows
  // that must stay whole in one part: Megatron's query_key_value holds each attention head's
  // q, k and v rows together, so a split that divides the rows but cuts a head is refused.
  int64_t unit = 1;
};

// Built-in rule sets: "metaseq" (OPT / metaseq model-parallel parts, as reshard_mp.py splits
// them) and "megatron" (Megatron-LM GPT tensor parallelism, checkpoint version >= 2, GeLU
// MLP; Megatron-LM names and Megatron-DeepSpeed pipeline names such as `3.mlp.dense_4h_to_h`
// and `8.weight`; no catch-all). Empty for other names.
std::string PartitionRulePreset(absl::string_view name);

class PartitionRules {
 public:
  // Limits on untrusted rule files.
  static constexpr size_t kMaxRules = 4096;
  static constexpr size_t kMaxPatternLength = 4096;

  PartitionRules();
  PartitionRules(PartitionRules&&) noexcept;
  PartitionRules& operator=(PartitionRules&&) noexcept;
  ~PartitionRules();

  // Compiles `rules`; InvalidArgument naming the rule on a bad pattern.
  static absl::StatusOr<PartitionRules> Create(std::vector<PartitionRule> rules);
  // Parses the JSON form. `source` names the text in error messages (usually its path).
  static absl::StatusOr<PartitionRules> FromJson(absl::string_view json, absl::string_view source);
  // Reads and parses a JSON rule file.
  static absl::StatusOr<PartitionRules> FromFile(const std::string& path);

  // The first rule matching `tensor_name`, or NotFound naming the tensor.
  absl::StatusOr<const PartitionRule*> Match(absl::string_view tensor_name) const;

  bool empty() const { return rules_.empty(); }
  const std::vector<PartitionRule>& rules() const { return rules_; }

 private:
  std::vector<PartitionRule> rules_;
  std::vector<std::unique_ptr<re2::RE2>> compiled_;
};

// Resolves a possibly negative split dimension against `rank`; InvalidArgument when out of range.
absl::StatusOr<int> ResolveSplitDim(const PartitionRule& rule, size_t rank,
                                    absl::string_view tensor_name);

}  // namespace reshard

#endif  // RESHARD_LIB_PLAN_PARTITION_RULES_H_
