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
#include <optional>
#include <string>
#include <utility>
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
  // Reads and parses a JSON rule file; a name that is no file but a registered preset
  // ("megatron") gives the preset's rules.
  static absl::StatusOr<PartitionRules> FromFile(const std::string& path);

  // The first rule matching `tensor_name`, or NotFound naming the tensor.
  absl::StatusOr<const PartitionRule*> Match(absl::string_view tensor_name) const;

  bool empty() const { return rules_.empty(); }
  const std::vector<PartitionRule>& rules() const { return rules_; }

 private:
  std::vector<PartitionRule> rules_;
  std::vector<std::unique_ptr<re2::RE2>> compiled_;
};

// The JSON form of `rules` (the form FromJson reads), e.g. to send a preset to the daemon.
std::string PartitionRulesToJson(const std::vector<PartitionRule>& rules);

// --- Presets: rule sets by name (`--rules megatron`) ---
//
// Input formats bring the rule sets of their training frameworks and register them from their
// own .cc with a file-scope `PartitionRulePresetRegistration` (the torch format registers
// "metaseq", the Megatron format "megatron"); a preset exists in a binary that links the
// format. PartitionRules::FromFile consults them for a name that is not a file.

void RegisterPartitionRulePreset(std::string name, std::vector<PartitionRule> rules);

// The rules of preset `name`, or nullopt when no linked format registered it.
std::optional<std::vector<PartitionRule>> FindPartitionRulePreset(absl::string_view name);

// The names of the registered presets, sorted.
std::vector<std::string> PartitionRulePresetNames();

// Preset `name` in JSON form (PartitionRulesToJson); empty for an unknown name.
std::string PartitionRulePreset(absl::string_view name);

struct PartitionRulePresetRegistration {
  PartitionRulePresetRegistration(std::string name, std::vector<PartitionRule> rules) {
    RegisterPartitionRulePreset(std::move(name), std::move(rules));
  }
};

// Resolves a possibly negative split dimension against `rank`; InvalidArgument when out of range.
absl::StatusOr<int> ResolveSplitDim(const PartitionRule& rule, size_t rank,
                                    absl::string_view tensor_name);

}  // namespace reshard

#endif  // RESHARD_LIB_PLAN_PARTITION_RULES_H_
