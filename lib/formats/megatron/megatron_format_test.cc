#include "lib/formats/megatron/megatron_format.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "lib/plan/partition_rules.h"

namespace reshard {
namespace {

TEST(MegatronInputTest, IdAndProbePriority) {
  const MegatronInput input;
  EXPECT_EQ(input.id(), "megatron");
  // Above DeepSpeed ZeRO (20) and DCP (30): it claims pipeline folders they would also see.
  EXPECT_EQ(input.probe_priority(), 40);
}

// Linking the format registers its preset, so `--rules megatron` finds it by name.
TEST(MegatronInputTest, RegistersTheMegatronPreset) {
  std::optional<std::vector<PartitionRule>> preset = FindPartitionRulePreset("megatron");
  ASSERT_TRUE(preset.has_value());
  EXPECT_EQ(PartitionRulesToJson(*preset), PartitionRulesToJson(MegatronPresetRules()));
  EXPECT_EQ(PartitionRulePreset("megatron"), PartitionRulesToJson(MegatronPresetRules()));
}

}  // namespace
}  // namespace reshard
