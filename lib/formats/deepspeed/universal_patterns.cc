#include "lib/formats/deepspeed/universal_patterns.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "re2/re2.h"

namespace reshard {
namespace {

using Node = StructureNode;

const Node* DictValue(const Node* dict, absl::string_view key) {
  if (dict == nullptr || dict->kind != Node::Kind::kDict) return nullptr;
  for (size_t i = 0; i < dict->keys.size() && i < dict->values.size(); ++i) {
    if (dict->keys[i].kind == Node::Kind::kString && dict->keys[i].text == key) {
      return &dict->values[i];
    }
  }
  return nullptr;
}

}  // namespace

UniversalPatterns::UniversalPatterns() = default;
UniversalPatterns::UniversalPatterns(UniversalPatterns&&) noexcept = default;
UniversalPatterns& UniversalPatterns::operator=(UniversalPatterns&&) noexcept = default;
UniversalPatterns::~UniversalPatterns() = default;

bool UniversalPatterns::List::Matches(absl::string_view name) const {
  for (const auto& re : compiled) {
    if (RE2::PartialMatch(re2::StringPiece(name.data(), name.size()), *re)) return true;
  }
  return false;
}

absl::Status UniversalPatterns::AddList(const Node* node, absl::string_view key, List& list) {
  if (node == nullptr || (node->kind != Node::Kind::kList && node->kind != Node::Kind::kTuple)) {
    return absl::OkStatus();
  }
  for (const Node& item : node->items) {
    if (item.kind != Node::Kind::kString) continue;
    RE2::Options options;
    options.set_log_errors(false);
    auto compiled = std::make_unique<RE2>(absl::StrCat("^(?:", item.text, ")"), options);
    if (!compiled->ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("universal_checkpoint_info.", key, ": \"", item.text,
                       "\" is not a regular expression reshard can use: ", compiled->error()));
    }
    list.patterns.push_back(item.text);
    list.compiled.push_back(std::move(compiled));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniversalPatterns> UniversalPatterns::FromInfo(const Node* info) {
  UniversalPatterns out;
  if (info == nullptr || info->kind != Node::Kind::kDict) return out;
  if (const Node* size = DictValue(info, "original_vocab_size");
      size != nullptr && size->kind == Node::Kind::kInt) {
    out.original_vocab_size_ = size->integer;
  }
  for (auto [key, list] :
       {std::pair<const char*, List*>{"tp_replicated_parameter_patterns", &out.replicated_},
        {"parameter_to_average_patterns", &out.average_},
        {"parameter_with_2_sub_params_cat_dim_0", &out.two_sub_},
        {"parameter_with_row_parallelism_patterns", &out.row_},
        {"vocabulary_parameter_patterns", &out.vocab_},
        {"pipeline_replicated_parameter_patterns", &out.pipeline_}}) {
    RETURN_IF_ERROR(AddList(DictValue(info, key), key, *list));
  }
  // parameter_with_sub_params: a list of SubparamShape dicts {patterns, shape, partition_dim}.
  if (const Node* shapes = DictValue(info, "parameter_with_sub_params"); shapes != nullptr) {
    for (const Node& shape : shapes->items) {
      RETURN_IF_ERROR(
          AddList(DictValue(&shape, "patterns"), "parameter_with_sub_params", out.sub_params_));
    }
  }
  return out;
}

UcpParamRule UniversalPatterns::Classify(absl::string_view name) const {
  UcpParamRule rule;
  if (replicated_.Matches(name)) {
    rule.merge = UcpMerge::kReplicated;
  } else if (average_.Matches(name)) {
    rule.merge = UcpMerge::kAverage;
  } else if (two_sub_.Matches(name)) {
    rule.merge = UcpMerge::kTwoSubParams;
  } else if (sub_params_.Matches(name)) {
    rule.merge = UcpMerge::kSubParams;
  } else if (row_.Matches(name)) {
    rule.merge = UcpMerge::kRowParallel;
  }
  rule.vocab = vocab_.Matches(name);
  return rule;
}

bool UniversalPatterns::PipelineReplicated(absl::string_view name) const {
  return pipeline_.Matches(name);
}

std::vector<PartitionRule> UniversalPatterns::MergeRules() const {
  std::vector<PartitionRule> rules;
  auto add = [&](const List& list, auto set) {
    for (const std::string& pattern : list.patterns) {
      PartitionRule rule;
      rule.pattern = absl::StrCat("^(?:", pattern, ")");
      set(rule);
      rules.push_back(std::move(rule));
    }
  };
  add(replicated_, [](PartitionRule& r) { r.replicate = true; });
  add(two_sub_, [](PartitionRule& r) { r.fused = 2; });
  add(row_, [](PartitionRule& r) { r.split_dim = 1; });
  PartitionRule rest;
  rest.pattern = ".*";
  rules.push_back(std::move(rest));
  return rules;
}

absl::string_view UcpMergeName(UcpMerge merge) {
  switch (merge) {
    case UcpMerge::kReplicated:
      return "tp_replicated_parameter_patterns";
    case UcpMerge::kAverage:
      return "parameter_to_average_patterns";
    case UcpMerge::kTwoSubParams:
      return "parameter_with_2_sub_params_cat_dim_0";
    case UcpMerge::kSubParams:
      return "parameter_with_sub_params";
    case UcpMerge::kRowParallel:
      return "parameter_with_row_parallelism_patterns";
    case UcpMerge::kColumnParallel:
      break;
  }
  return "(no pattern: concatenated on dim 0)";
}

}  // namespace reshard
