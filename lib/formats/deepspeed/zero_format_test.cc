#include "lib/formats/deepspeed/zero_format.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

// Elements of a param that its runs cover, in order and without gaps.
int64_t Covered(const std::vector<ZeroRun>& runs) {
  int64_t next = 0;
  for (const ZeroRun& run : runs) {
    EXPECT_EQ(run.begin, next);
    EXPECT_GT(run.count, 0);
    next += run.count;
  }
  return next;
}

// The worked example of the spec (§1.4): W=4, A (15), B (7), C (8) -> T=30, A_g=32, P=8.
TEST(LayoutZero12GroupTest, WorkedExample) {
  auto layout = LayoutZero12Group(4, 1, {15, 7, 8});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->total, 30);
  EXPECT_EQ(layout->aligned, 32);
  EXPECT_EQ(layout->partition, 8);
  ASSERT_EQ(layout->params.size(), 3u);
  // A = rank0[0:8] + rank1[0:7]
  EXPECT_EQ(layout->params[0], (std::vector<ZeroRun>{{0, 1, 0, 0, 8}, {1, 1, 0, 8, 7}}));
  // B = rank1[7:8] + rank2[0:6]
  EXPECT_EQ(layout->params[1], (std::vector<ZeroRun>{{1, 1, 7, 0, 1}, {2, 1, 0, 1, 6}}));
  // C = rank2[6:8] + rank3[0:6]
  EXPECT_EQ(layout->params[2], (std::vector<ZeroRun>{{2, 1, 6, 0, 2}, {3, 1, 0, 2, 6}}));
  EXPECT_EQ(layout->UnpaddedLength(0), 8);
  EXPECT_EQ(layout->UnpaddedLength(2), 8);
  EXPECT_EQ(layout->UnpaddedLength(3), 6);
}

TEST(LayoutZero12GroupTest, TrailingRanksWithoutData) {
  // T=5 over 8 ranks: A=16, P=2; ranks 0..2 hold 2, 2, 1 elements, ranks 3..7 nothing.
  auto layout = LayoutZero12Group(8, 0, {3, 0, 2});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->aligned, 16);
  EXPECT_EQ(layout->partition, 2);
  EXPECT_TRUE(layout->params[1].empty());
  EXPECT_EQ(layout->params[2], (std::vector<ZeroRun>{{1, 0, 1, 0, 1}, {2, 0, 0, 1, 1}}));
  EXPECT_EQ(layout->UnpaddedLength(2), 1);
  EXPECT_EQ(layout->UnpaddedLength(3), 0);
  EXPECT_EQ(layout->UnpaddedLength(7), 0);
}

TEST(LayoutZero12GroupTest, OneRankAndLargeParams) {
  auto layout = LayoutZero12Group(1, 0, {7});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->aligned, 8);
  EXPECT_EQ(layout->params[0], (std::vector<ZeroRun>{{0, 0, 0, 0, 7}}));
  // A param larger than a partition spans several ranks.
  layout = LayoutZero12Group(3, 0, {1, 20});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->aligned, 24);
  EXPECT_EQ(layout->partition, 8);
  EXPECT_EQ(layout->params[1],
            (std::vector<ZeroRun>{{0, 0, 1, 0, 7}, {1, 0, 0, 7, 8}, {2, 0, 0, 15, 5}}));
  EXPECT_EQ(Covered(layout->params[1]), 20);
}

TEST(LayoutZero12GroupTest, RejectsBadNumbers) {
  EXPECT_FALSE(LayoutZero12Group(0, 0, {1}).ok());
  EXPECT_FALSE(LayoutZero12Group(kZeroMaxWorld + 1, 0, {1}).ok());
  EXPECT_FALSE(LayoutZero12Group(2, 0, {-1}).ok());
  const int64_t big = int64_t{1} << 61;
  EXPECT_FALSE(LayoutZero12Group(2, 0, {big, big, big}).ok());
  EXPECT_EQ(Zero12Align(30, 4), 32);
  EXPECT_EQ(Zero12Align(32, 4), 32);
  EXPECT_EQ(Zero12Align(0, 4), 0);
}

// The worked example of the spec (§1.5): W=4, A (15) -> P=4, B (7) -> P=2, C (10) -> P=3; every
// rank's flat group has 9 elements [A:4 | B:2 | C:3].
TEST(LayoutZero3Test, WorkedExample) {
  auto layout = LayoutZero3(4, {15, 7, 10}, {9});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->partitions, (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(layout->per_rank, 9);
  // A: ranks 0..3 hold 4, 4, 4, 3 real elements at offset 0.
  EXPECT_EQ(
      layout->params[0],
      (std::vector<ZeroRun>{{0, 0, 0, 0, 4}, {1, 0, 0, 4, 4}, {2, 0, 0, 8, 4}, {3, 0, 0, 12, 3}}));
  // B: 7 elements, P=2: rank 3 holds one.
  EXPECT_EQ(
      layout->params[1],
      (std::vector<ZeroRun>{{0, 0, 4, 0, 2}, {1, 0, 4, 2, 2}, {2, 0, 4, 4, 2}, {3, 0, 4, 6, 1}}));
  // Element e of C is on rank e div 3 at local index 6 + e mod 3.
  EXPECT_EQ(
      layout->params[2],
      (std::vector<ZeroRun>{{0, 0, 6, 0, 3}, {1, 0, 6, 3, 3}, {2, 0, 6, 6, 3}, {3, 0, 6, 9, 1}}));
}

TEST(LayoutZero3Test, SplitsAtSubGroupBoundaries) {
  // Sub-groups of 5 and 4 elements per rank: B's slice [4, 6) crosses the boundary at 5.
  auto layout = LayoutZero3(4, {15, 7, 10}, {5, 4});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->params[0][1], (ZeroRun{1, 0, 0, 4, 4}));
  EXPECT_EQ(layout->params[1], (std::vector<ZeroRun>{{0, 0, 4, 0, 1},
                                                     {0, 1, 0, 1, 1},
                                                     {1, 0, 4, 2, 1},
                                                     {1, 1, 0, 3, 1},
                                                     {2, 0, 4, 4, 1},
                                                     {2, 1, 0, 5, 1},
                                                     {3, 0, 4, 6, 1}}));
  EXPECT_EQ(Covered(layout->params[1]), 7);
  EXPECT_EQ(layout->params[2][0], (ZeroRun{0, 1, 1, 0, 3}));
  // Empty sub-groups are skipped.
  layout = LayoutZero3(2, {4, 3}, {0, 2, 0, 2, 0});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->params[1], (std::vector<ZeroRun>{{0, 3, 0, 0, 2}, {1, 3, 0, 2, 1}}));
}

TEST(LayoutZero3Test, SmallParamsOnManyRanks) {
  // n=3 over 8 ranks: P=1, ranks 3..7 hold only padding.
  auto layout = LayoutZero3(8, {3, 1}, {2});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->params[0].size(), 3u);
  EXPECT_EQ(layout->params[1], (std::vector<ZeroRun>{{0, 0, 1, 0, 1}}));
  // A 0-d param (1 element) and an empty one.
  layout = LayoutZero3(3, {1, 0, 5}, {3});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->partitions, (std::vector<int64_t>{1, 0, 2}));
  EXPECT_TRUE(layout->params[1].empty());
  EXPECT_EQ(layout->params[2],
            (std::vector<ZeroRun>{{0, 0, 1, 0, 2}, {1, 0, 1, 2, 2}, {2, 0, 1, 4, 1}}));
}

TEST(LayoutZero3Test, TotalMismatchNamesBothNumbers) {
  auto layout = LayoutZero3(4, {15, 7, 10}, {8});
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(layout.status().message());
  EXPECT_NE(message.find("4 x 9"), std::string::npos) << message;
  EXPECT_NE(message.find("hold 8"), std::string::npos) << message;
}

TEST(LayoutZero3Test, RejectsBadNumbers) {
  EXPECT_FALSE(LayoutZero3(0, {1}, {1}).ok());
  EXPECT_FALSE(LayoutZero3(2, {-4}, {0}).ok());
  EXPECT_FALSE(LayoutZero3(2, {4}, {-1, 3}).ok());
  const int64_t big = int64_t{1} << 62;
  EXPECT_FALSE(LayoutZero3(1, {big, big}, {0}).ok());
  // Too many pieces for a Catalog: 2^20 params of 2^20 elements over 2^16 ranks.
  std::vector<int64_t> numels(1 << 11, int64_t{1} << 20);
  EXPECT_FALSE(LayoutZero3(1 << 16, numels, {int64_t{1} << 15}).ok());
}

TEST(ParseZeroFileNameTest, Names) {
  using K = ZeroFileName::Kind;
  auto optim = ParseZeroFileName("bf16_zero_pp_rank_12_mp_rank_00_optim_states.pt");
  ASSERT_TRUE(optim.has_value());
  EXPECT_EQ(optim->kind, K::kOptimizer);
  EXPECT_EQ(optim->prefix, "bf16_");
  EXPECT_EQ(optim->dp, 12);
  EXPECT_EQ(optim->mp, 0);
  optim = ParseZeroFileName("zero_pp_rank_3_mp_rank_01_optim_states.pt");
  ASSERT_TRUE(optim.has_value());
  EXPECT_EQ(optim->prefix, "");
  EXPECT_EQ(optim->mp, 1);
  EXPECT_EQ(ParseZeroFileName("fp16_zero_pp_rank_0_mp_rank_00_optim_states.pt")->prefix, "fp16_");
  auto model = ParseZeroFileName("zero_pp_rank_7_mp_rank_00_model_states.pt");
  ASSERT_TRUE(model.has_value());
  EXPECT_EQ(model->kind, K::kRankModel);
  EXPECT_EQ(model->dp, 7);
  EXPECT_EQ(ParseZeroFileName("mp_rank_00_model_states.pt")->kind, K::kModel);
  EXPECT_EQ(ParseZeroFileName("layer_03-model_01-model_states.pt")->kind, K::kPipelineLayer);
  for (const char* other :
       {"zero_pp_rank__mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pth",
        "bf16_zero_pp_rank_1_mp_rank_00_model_states.pt",
        "zero_pp_rank_1234567890_mp_rank_00_optim_states.pt",
        "zero_pp_rank_-1_mp_rank_00_optim_states.pt", "latest", "zero_to_fp32.py",
        "layer_01_expert_0_mp_rank_00_model_states.pt", "expp_rank_0_mp_rank_00_optim_states.pt",
        "xzero_pp_rank_0_mp_rank_00_optim_states.pt"}) {
    EXPECT_FALSE(ParseZeroFileName(other).has_value()) << other;
  }
}

void Touch(const std::string& path) { WriteAll(path, ""); }

TEST(ZeroInputTest, ProbeByFileNames) {
  const ZeroInput input;
  EXPECT_EQ(input.id(), "deepspeed-zero");
  EXPECT_EQ(input.probe_priority(), 10);
  const std::string root = MakeTempDir("zero_probe");
  // A tag folder.
  const std::string tag = root + "/run/global_step5";
  fs::create_directories(tag);
  Touch(tag + "/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  Touch(tag + "/mp_rank_00_model_states.pt");
  EXPECT_TRUE(input.Probe(tag));
  // Its parent, with or without `latest`.
  EXPECT_TRUE(input.Probe(root + "/run"));
  Touch(root + "/run/latest");
  EXPECT_TRUE(input.Probe(root + "/run"));
  // A pipeline checkpoint is the Megatron reader's.
  const std::string pipe = root + "/pipe/global_step5";
  fs::create_directories(pipe);
  Touch(pipe + "/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  Touch(pipe + "/layer_01-model_00-model_states.pt");
  EXPECT_FALSE(input.Probe(pipe));
  EXPECT_FALSE(input.Probe(root + "/pipe"));
  // Other folders and files.
  const std::string plain = root + "/plain";
  fs::create_directories(plain);
  Touch(plain + "/model.pt");
  EXPECT_FALSE(input.Probe(plain));
  EXPECT_FALSE(input.Probe(plain + "/model.pt"));
  EXPECT_FALSE(input.Probe(tag + "/zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_FALSE(input.Probe(root + "/missing"));
}

TEST(ZeroInputTest, ReadRejectsBadTagsAndMissingLatest) {
  const ZeroInput input;
  const std::string root = MakeTempDir("zero_tags");
  for (const char* name : {"global_step5", "global_step10"}) {
    fs::create_directories(root + "/" + name);
    Touch(root + "/" + name + "/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  }
  ReadOptions options;
  auto model = input.Read(root, options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  std::string message(model.status().message());
  EXPECT_NE(message.find("global_step5, global_step10"), std::string::npos) << message;
  EXPECT_NE(message.find("--tag"), std::string::npos) << message;

  for (const char* bad : {"../global_step5", "a/b", "..", "."}) {
    options.tag = bad;
    model = input.Read(root, options);
    ASSERT_FALSE(model.ok()) << bad;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  }
  options.tag = "global_step7";
  model = input.Read(root, options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);

  WriteAll(root + "/latest", "../etc\n");
  options.tag = "";
  model = input.Read(root, options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  WriteAll(root + "/latest", "global_step99");
  model = input.Read(root, options);
  ASSERT_FALSE(model.ok());
  message = std::string(model.status().message());
  EXPECT_NE(message.find("global_step99"), std::string::npos) << message;
  // `latest` naming an existing folder gets as far as opening its (empty, invalid) files.
  WriteAll(root + "/latest", " global_step10 \n");
  model = input.Read(root, options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  message = std::string(model.status().message());
  EXPECT_NE(message.find("global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt"),
            std::string::npos)
      << message;
}

TEST(ZeroInputTest, ReadRefusesModelParallelAndExpertFiles) {
  const ZeroInput input;
  const std::string root = MakeTempDir("zero_mp");
  Touch(root + "/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  Touch(root + "/zero_pp_rank_0_mp_rank_01_optim_states.pt");
  auto model = input.Read(root, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented) << model.status();
  EXPECT_NE(std::string(model.status().message()).find("mp_rank_00"), std::string::npos);

  const std::string moe = MakeTempDir("zero_moe");
  Touch(moe + "/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  Touch(moe + "/expp_rank_0_mp_rank_00_optim_states.pt");
  model = input.Read(moe, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented) << model.status();
}

TEST(ZeroInputTest, MissingRankZeroNamesTheFile) {
  const ZeroInput input;
  const std::string root = MakeTempDir("zero_rank0");
  Touch(root + "/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt");
  auto model = input.Read(root, ReadOptions{});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  const std::string message(model.status().message());
  EXPECT_NE(
      message.find("rank 0's optimizer file (bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt)"),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("partial save"), std::string::npos) << message;
}

}  // namespace
}  // namespace reshard
