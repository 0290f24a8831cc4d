#include "lib/formats/megatron/megatron_save_folder.h"

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace megatron_internal {
namespace {

namespace fs = std::filesystem;

// A save folder with Megatron-LM checkpoint iter_0000100 (one rank folder; the file itself is
// only needed by the reader).
std::string SaveFolder(const std::string& tag) {
  const std::string root = MakeTempDir(tag);
  fs::create_directories(root + "/iter_0000100/mp_rank_00");
  return root;
}

TEST(ResolveCheckpointTest, TrackerNamesTheIteration) {
  const std::string root = SaveFolder("megatron_tracker");
  WriteAll(root + "/latest_checkpointed_iteration.txt", "100\n");
  auto resolved = ResolveCheckpoint(root, "");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->dir, root + "/iter_0000100");
  EXPECT_EQ(resolved->name, "iter_0000100");
  EXPECT_EQ(resolved->layout, Layout::kMegatronLM);
  // The folder itself, and --tag as a number or a folder name.
  resolved = ResolveCheckpoint(root + "/iter_0000100/", "");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->name, "iter_0000100");
  for (const char* tag : {"100", "iter_0000100"}) {
    resolved = ResolveCheckpoint(root, tag);
    ASSERT_TRUE(resolved.ok()) << tag << ": " << resolved.status();
    EXPECT_EQ(resolved->dir, root + "/iter_0000100");
  }
}

TEST(ResolveCheckpointTest, WithoutTrackerAsksForATag) {
  const std::string root = SaveFolder("megatron_no_tracker");
  auto resolved = ResolveCheckpoint(root, "");
  ASSERT_FALSE(resolved.ok());
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(resolved.status().message().find("iter_0000100"), absl::string_view::npos)
      << resolved.status();
  EXPECT_EQ(ResolveCheckpoint(root, "../iter_0000100").status().code(),
            absl::StatusCode::kNotFound);
}

// Tracker files larger than checkpoint_folder's limit are refused, not read truncated to their
// first 4 KiB.
TEST(ResolveCheckpointTest, RefusesOversizedTrackerFiles) {
  for (const char* tracker : {"latest_checkpointed_iteration.txt", "latest"}) {
    const std::string root = SaveFolder("megatron_large_tracker");
    WriteAll(root + "/" + tracker, "100" + std::string(5000, ' '));
    auto resolved = ResolveCheckpoint(root, "");
    ASSERT_FALSE(resolved.ok()) << tracker;
    EXPECT_EQ(resolved.status().code(), absl::StatusCode::kDataLoss) << resolved.status();
    EXPECT_NE(resolved.status().message().find(tracker), absl::string_view::npos)
        << resolved.status();
  }
}

}  // namespace
}  // namespace megatron_internal
}  // namespace reshard
