#include "lib/engine/partition_spec.h"

#include <map>
#include <numeric>
#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

PartitionEnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(ParsePartitionTest, ExplicitIndexOfCount) {
  auto id = ParsePartition("2/4", FakeEnv({}));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->index, 2);
  EXPECT_EQ(id->count, 4);
  EXPECT_EQ(PartitionName(*id), "2/4");
}

TEST(ParsePartitionTest, RefusesMalformedAndOutOfRange) {
  for (const char* text : {"4/4", "-1/4", "1/0", "1", "1/2/3", "a/b", "", "1/5000"}) {
    EXPECT_FALSE(ParsePartition(text, FakeEnv({})).ok()) << text;
  }
}

TEST(ParsePartitionTest, SlurmArrayTask) {
  auto id = ParsePartition("auto", FakeEnv({{"SLURM_ARRAY_TASK_ID", "2"},
                                            {"SLURM_ARRAY_TASK_MIN", "0"},
                                            {"SLURM_ARRAY_TASK_MAX", "3"},
                                            {"SLURM_ARRAY_TASK_COUNT", "4"}}));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->index, 2);
  EXPECT_EQ(id->count, 4);
}

TEST(ParsePartitionTest, SlurmArrayNotNumberedFromZeroIsRefused) {
  for (auto [min, max] : {std::pair<const char*, const char*>{"1", "4"}, {"0", "6"}}) {
    auto id = ParsePartition("auto", FakeEnv({{"SLURM_ARRAY_TASK_ID", "2"},
                                              {"SLURM_ARRAY_TASK_MIN", min},
                                              {"SLURM_ARRAY_TASK_MAX", max},
                                              {"SLURM_ARRAY_TASK_COUNT", "4"}}));
    ASSERT_FALSE(id.ok()) << min << "-" << max;
    EXPECT_NE(id.status().message().find("--array=0-K-1"), std::string::npos) << id.status();
  }
}

TEST(ParsePartitionTest, RerunOfOneArrayTaskTakesTheGivenCount) {
  // `sbatch --array=2` reruns task 2 as an array of one task.
  const auto env = FakeEnv({{"SLURM_ARRAY_TASK_ID", "2"},
                            {"SLURM_ARRAY_TASK_MIN", "2"},
                            {"SLURM_ARRAY_TASK_MAX", "2"},
                            {"SLURM_ARRAY_TASK_COUNT", "1"}});
  EXPECT_FALSE(ParsePartition("auto", env).ok());
  auto given = ParsePartition("auto/4", env);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->index, 2);
  EXPECT_EQ(given->count, 4);
  auto from_env = ParsePartition("auto", FakeEnv({{"SLURM_ARRAY_TASK_ID", "2"},
                                                  {"SLURM_ARRAY_TASK_COUNT", "1"},
                                                  {"RESHARD_PARTITION_COUNT", "4"}}));
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->count, 4);
}

TEST(ParsePartitionTest, SrunStepTask) {
  auto id = ParsePartition("auto", FakeEnv({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}}));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->index, 3);
  EXPECT_EQ(id->count, 8);
}

// `srun -n 2` inside the tasks of `sbatch --array=0-1`: the variables Slurm 22.05 exports to
// the step's tasks (tests/cluster/slurm_test.sh runs it for real). Four partitions, one per
// step task, where the array index alone gave both step tasks of an array task the same one.
TEST(ParsePartitionTest, SrunStepInsideAnArrayTask) {
  std::map<std::string, std::string> vars = {
      {"SLURM_ARRAY_TASK_ID", "1"},    {"SLURM_ARRAY_TASK_MIN", "0"}, {"SLURM_ARRAY_TASK_MAX", "1"},
      {"SLURM_ARRAY_TASK_COUNT", "2"}, {"SLURM_NTASKS", "2"},         {"SLURM_STEP_ID", "0"},
      {"SLURM_STEP_NUM_TASKS", "2"},   {"SLURM_PROCID", "1"}};
  auto id = ParsePartition("auto", FakeEnv(vars));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->index, 3);
  EXPECT_EQ(id->count, 4);
  // A rerun of array task 1 alone, K given: the same partitions.
  vars["SLURM_ARRAY_TASK_MIN"] = vars["SLURM_ARRAY_TASK_MAX"] = "1";
  vars["SLURM_ARRAY_TASK_COUNT"] = "1";
  vars["SLURM_PROCID"] = "0";
  auto rerun = ParsePartition("auto/4", FakeEnv(vars));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_EQ(rerun->index, 2);
  EXPECT_EQ(rerun->count, 4);
  // The batch step of the same job (no SLURM_STEP_ID; SLURM_NTASKS is the job's): the array
  // index, as before.
  auto batch = ParsePartition("auto", FakeEnv({{"SLURM_ARRAY_TASK_ID", "1"},
                                               {"SLURM_ARRAY_TASK_COUNT", "2"},
                                               {"SLURM_NTASKS", "2"},
                                               {"SLURM_PROCID", "0"}}));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->index, 1);
  EXPECT_EQ(batch->count, 2);
  // A step task without its rank, or with a rank beyond the step's tasks, is refused.
  vars.erase("SLURM_PROCID");
  EXPECT_FALSE(ParsePartition("auto/4", FakeEnv(vars)).ok());
  vars["SLURM_PROCID"] = "2";
  auto beyond = ParsePartition("auto/4", FakeEnv(vars));
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("SLURM_PROCID 2"), std::string::npos) << beyond.status();
}

TEST(ParsePartitionTest, KubernetesIndexedJobNeedsTheCount) {
  auto missing = ParsePartition("auto", FakeEnv({{"JOB_COMPLETION_INDEX", "1"}}));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("auto/K"), std::string::npos) << missing.status();

  auto given = ParsePartition("auto/3", FakeEnv({{"JOB_COMPLETION_INDEX", "1"}}));
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(given->index, 1);
  EXPECT_EQ(given->count, 3);

  auto from_env = ParsePartition(
      "auto", FakeEnv({{"JOB_COMPLETION_INDEX", "2"}, {"RESHARD_PARTITION_COUNT", "3"}}));
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->count, 3);

  // Index beyond the count.
  EXPECT_FALSE(ParsePartition("auto/2", FakeEnv({{"JOB_COMPLETION_INDEX", "2"}})).ok());
}

TEST(ParsePartitionTest, GivenCountWinsOverTheEngines) {
  auto id = ParsePartition("auto/3", FakeEnv({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}}));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->count, 3);
  EXPECT_FALSE(ParsePartition("auto/2", FakeEnv({{"SLURM_PROCID", "2"}})).ok());
}

TEST(ParsePartitionTest, AutoOutsideAnEngineIsRefused) {
  auto id = ParsePartition("auto", FakeEnv({}));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("--partition I/K"), std::string::npos) << id.status();
}

TEST(AssignPartitionsTest, LargestFirstToTheLightest) {
  // 9, 7, 6, 5, 4, 3 over 2: 9->0, 7->1, 6->1 (13), 5->0 (14), 4->1 (17), 3->0 (17).
  const std::vector<uint64_t> bytes = {3, 9, 4, 7, 6, 5};
  const std::vector<int> assignment = AssignPartitions(bytes, 2);
  EXPECT_EQ(assignment, (std::vector<int>{0, 0, 1, 1, 1, 0}));
  uint64_t load[2] = {0, 0};
  for (size_t i = 0; i < bytes.size(); ++i) load[assignment[i]] += bytes[i];
  EXPECT_EQ(load[0], 17u);
  EXPECT_EQ(load[1], 17u);
}

TEST(AssignPartitionsTest, DeterministicAndEveryFileOnce) {
  std::vector<uint64_t> bytes;
  for (int i = 0; i < 101; ++i) bytes.push_back(static_cast<uint64_t>((i * 7919) % 1000 + 1));
  const std::vector<int> first = AssignPartitions(bytes, 7);
  EXPECT_EQ(first, AssignPartitions(bytes, 7));
  std::vector<uint64_t> load(7, 0);
  for (size_t i = 0; i < bytes.size(); ++i) {
    ASSERT_GE(first[i], 0);
    ASSERT_LT(first[i], 7);
    load[first[i]] += bytes[i];
  }
  const uint64_t total = std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
  const uint64_t largest = *std::max_element(load.begin(), load.end());
  const uint64_t largest_file = *std::max_element(bytes.begin(), bytes.end());
  // Greedy: no partition exceeds the mean by more than one file.
  EXPECT_LE(largest, total / 7 + largest_file);
}

TEST(AssignPartitionsTest, MorePartitionsThanFilesLeavesSomeEmpty) {
  const std::vector<int> assignment = AssignPartitions({5, 5}, 4);
  EXPECT_EQ(assignment, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace reshard
