#include "lib/plan/partition_rules.h"

#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/status.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace reshard {

PartitionRules::PartitionRules() = default;
PartitionRules::PartitionRules(PartitionRules&&) noexcept = default;
PartitionRules& PartitionRules::operator=(PartitionRules&&) noexcept = default;
PartitionRules::~PartitionRules() = default;

absl::StatusOr<PartitionRules> PartitionRules::Create(std::vector<PartitionRule> rules) {
  if (rules.size() > kMaxRules) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many partition rules: ", rules.size(), " (at most ", kMaxRules, ")"));
  }
  PartitionRules result;
  for (size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].pattern.size() > kMaxPatternLength) {
      return absl::InvalidArgumentError(
          absl::StrCat("rule #", i, ": pattern longer than ", kMaxPatternLength, " characters"));
    }
    RE2::Options options;
    options.set_log_errors(false);
    auto compiled = std::make_unique<RE2>(rules[i].pattern, options);
    if (!compiled->ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rule #", i, ": bad pattern \"",
                                                     rules[i].pattern, "\": ", compiled->error()));
    }
    result.compiled_.push_back(std::move(compiled));
  }
  result.rules_ = std::move(rules);
  return result;
}

absl::StatusOr<PartitionRules> PartitionRules::FromJson(absl::string_view json,
                                                        absl::string_view source) {
  auto error = [&](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat("partition rules ", source, ": ", message));
  };
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    return error(absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!document.is_object() || !document.contains("rules") || !document["rules"].is_array()) {
    return error("expected an object {\"rules\": [...]}");
  }
  std::vector<PartitionRule> rules;
  for (size_t i = 0; i < document["rules"].size(); ++i) {
    const nlohmann::json& entry = document["rules"][i];
    const std::string where = absl::StrCat("rule #", i, ": ");
    if (!entry.is_object() || !entry.contains("pattern") || !entry["pattern"].is_string()) {
      return error(where + "expected an object with a string \"pattern\"");
    }
    PartitionRule rule;
    rule.pattern = entry["pattern"].get<std::string>();
    const bool has_dim = entry.contains("split_dim");
    const bool replicate = entry.contains("replicate") && entry["replicate"].is_boolean() &&
                           entry["replicate"].get<bool>();
    if (has_dim == replicate) {
      return error(where + "give exactly one of \"split_dim\": N or \"replicate\": true");
    }
    if (has_dim) {
      if (!entry["split_dim"].is_number_integer() || entry["split_dim"].get<int64_t>() > 64 ||
          entry["split_dim"].get<int64_t>() < -64) {
        return error(where + "\"split_dim\" must be an integer in [-64, 64]");
      }
      rule.split_dim = entry["split_dim"].get<int>();
    }
    rule.replicate = replicate;
    if (entry.contains("fused")) {
      if (!has_dim || !entry["fused"].is_number_integer() || entry["fused"].get<int64_t>() < 1 ||
          entry["fused"].get<int64_t>() > 64) {
        return error(where + "\"fused\" must be an integer in [1, 64], with \"split_dim\"");
      }
      rule.fused = entry["fused"].get<int>();
    }
    if (entry.contains("unit")) {
      if (!has_dim || !entry["unit"].is_number_integer() || entry["unit"].get<int64_t>() < 1 ||
          entry["unit"].get<int64_t>() > (int64_t{1} << 40)) {
        return error(where + "\"unit\" must be a positive integer, with \"split_dim\"");
      }
      rule.unit = entry["unit"].get<int64_t>();
    }
    for (const auto& item : entry.items()) {
      if (item.key() != "pattern" && item.key() != "split_dim" && item.key() != "replicate" &&
          item.key() != "fused" && item.key() != "unit") {
        return error(absl::StrCat(where, "unknown field \"", item.key(), "\""));
      }
    }
    rules.push_back(std::move(rule));
  }
  ASSIGN_OR_RETURN(PartitionRules created, Create(std::move(rules)),
                   absl::StrCat("partition rules ", source));
  return created;
}

namespace {

struct PresetRegistry {
  absl::Mutex mu;
  std::map<std::string, std::vector<PartitionRule>, std::less<>> presets ABSL_GUARDED_BY(mu);
};

PresetRegistry& GetPresetRegistry() {
  static PresetRegistry* const registry = new PresetRegistry;
  return *registry;
}

}  // namespace

std::string PartitionRulesToJson(const std::vector<PartitionRule>& rules) {
  nlohmann::json list = nlohmann::json::array();
  for (const PartitionRule& rule : rules) {
    nlohmann::json entry = {{"pattern", rule.pattern}};
    if (rule.replicate) {
      entry["replicate"] = true;
    } else {
      entry["split_dim"] = rule.split_dim;
      if (rule.fused != 1) entry["fused"] = rule.fused;
      if (rule.unit != 1) entry["unit"] = rule.unit;
    }
    list.push_back(std::move(entry));
  }
  return nlohmann::json{{"rules", std::move(list)}}.dump();
}

void RegisterPartitionRulePreset(std::string name, std::vector<PartitionRule> rules) {
  PresetRegistry& registry = GetPresetRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.presets[std::move(name)] = std::move(rules);
}

std::optional<std::vector<PartitionRule>> FindPartitionRulePreset(absl::string_view name) {
  PresetRegistry& registry = GetPresetRegistry();
  absl::MutexLock lock(&registry.mu);
  auto it = registry.presets.find(name);
  if (it == registry.presets.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> PartitionRulePresetNames() {
  PresetRegistry& registry = GetPresetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> names;
  for (const auto& [name, rules] : registry.presets) names.push_back(name);
  return names;
}

std::string PartitionRulePreset(absl::string_view name) {
  std::optional<std::vector<PartitionRule>> preset = FindPartitionRulePreset(name);
  return preset.has_value() ? PartitionRulesToJson(*preset) : std::string();
}

absl::StatusOr<PartitionRules> PartitionRules::FromFile(const std::string& path) {
  if (std::optional<std::vector<PartitionRule>> preset = FindPartitionRulePreset(path)) {
    std::ifstream probe(path);
    if (!probe) {  // no such file: the preset
      auto rules = Create(*std::move(preset));
      if (!rules.ok()) {
        return Annotate(rules.status(), absl::StrCat("partition rules preset ", path));
      }
      return rules;
    }
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const std::vector<std::string> presets = PartitionRulePresetNames();
    const std::string known =
        presets.empty() ? ""
                        : absl::StrCat(" (nor is it a preset: ", absl::StrJoin(presets, ", "), ")");
    return absl::NotFoundError(absl::StrCat("cannot open partition rules file ", path, known));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > (16u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition rules file ", path, " is larger than 16 MiB"));
  }
  return FromJson(text.str(), path);
}

absl::StatusOr<const PartitionRule*> PartitionRules::Match(absl::string_view tensor_name) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (RE2::PartialMatch(re2::StringPiece(tensor_name.data(), tensor_name.size()),
                          *compiled_[i])) {
      return &rules_[i];
    }
  }
  return absl::NotFoundError(absl::StrCat("tensor \"", tensor_name,
                                          "\" matches no partition rule (add a rule for it, or a "
                                          "catch-all {\"pattern\": \".*\", \"replicate\": true})"));
}

absl::StatusOr<int> ResolveSplitDim(const PartitionRule& rule, size_t rank,
                                    absl::string_view tensor_name) {
  int dim = rule.split_dim < 0 ? rule.split_dim + static_cast<int>(rank) : rule.split_dim;
  if (dim < 0 || dim >= static_cast<int>(rank)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor_name, "\" has ", rank,
                                                   " dimension(s); rule \"", rule.pattern,
                                                   "\" splits dimension ", rule.split_dim));
  }
  return dim;
}

}  // namespace reshard
