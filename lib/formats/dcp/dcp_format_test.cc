// Tests of the DCP reader's file handling without torch: data-file path confinement, probing,
// and the refusals that come before any data is read. Whole checkpoints written by real torch
// are tested end to end in tests/dcp_e2e_test.py.

#include "lib/formats/dcp/dcp_format.h"

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

TEST(ResolveDcpDataFileTest, AcceptsFilesInsideTheFolder) {
  const std::string dir = MakeTempDir("dcp_inside");
  WriteAll(dir + "/__0_0.distcp", "x");
  fs::create_directories(dir + "/sub");
  WriteAll(dir + "/sub/__1_0.distcp", "y");
  fs::create_symlink("__0_0.distcp", dir + "/link.distcp");
  absl::StatusOr<std::string> path = ResolveDcpDataFile(dir, "__0_0.distcp");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir + "/__0_0.distcp");
  EXPECT_TRUE(ResolveDcpDataFile(dir, "sub/__1_0.distcp").ok());
  EXPECT_TRUE(ResolveDcpDataFile(dir, "./__0_0.distcp").ok());
  EXPECT_TRUE(ResolveDcpDataFile(dir, "link.distcp").ok());
}

TEST(ResolveDcpDataFileTest, RefusesPathsLeavingTheFolder) {
  const std::string root = MakeTempDir("dcp_escape");
  const std::string dir = root + "/ckpt";
  fs::create_directories(dir + "/sub");
  WriteAll(root + "/x.distcp", "outside");
  fs::create_symlink(root + "/x.distcp", dir + "/out.distcp");
  for (const char* bad : {"../x.distcp", "sub/../../x.distcp", "..", "/etc/passwd", ""}) {
    absl::StatusOr<std::string> path = ResolveDcpDataFile(dir, bad);
    EXPECT_EQ(path.status().code(), absl::StatusCode::kDataLoss) << bad << ": " << path.status();
  }
  absl::StatusOr<std::string> path = ResolveDcpDataFile(dir, "out.distcp");
  EXPECT_EQ(path.status().code(), absl::StatusCode::kDataLoss) << path.status();
  EXPECT_NE(path.status().message().find("outside the checkpoint folder"), std::string::npos)
      << path.status();
  path = ResolveDcpDataFile(dir, std::string("a\0b", 3));
  EXPECT_EQ(path.status().code(), absl::StatusCode::kDataLoss);
  // Not a regular file, and missing.
  EXPECT_EQ(ResolveDcpDataFile(dir, "sub").status().code(), absl::StatusCode::kDataLoss);
  path = ResolveDcpDataFile(dir, "__9_0.distcp");
  EXPECT_EQ(path.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(path.status().message().find("__9_0.distcp"), std::string::npos) << path.status();
}

TEST(DcpInputTest, ProbeRecognizesFoldersByFileNames) {
  DcpInput input;
  EXPECT_EQ(input.id(), "torch-dcp");
  EXPECT_EQ(input.probe_priority(), 30);
  const std::string with_metadata = MakeTempDir("dcp_probe_md");
  WriteAll(with_metadata + "/.metadata", "");
  EXPECT_TRUE(input.Probe(with_metadata).value());
  EXPECT_TRUE(input.Probe(with_metadata + "/.metadata").value());
  const std::string with_data = MakeTempDir("dcp_probe_data");
  WriteAll(with_data + "/__3_0.distcp", "");
  EXPECT_TRUE(input.Probe(with_data).value());
  const std::string other = MakeTempDir("dcp_probe_other");
  WriteAll(other + "/model.distcp", "");
  WriteAll(other + "/model.pt", "");
  EXPECT_FALSE(input.Probe(other).value());
  EXPECT_FALSE(input.Probe(other + "/model.pt").value());
  EXPECT_FALSE(input.Probe(other + "/missing").value());
}

TEST(DcpInputTest, ReadRefusesFoldersWithoutGlobalMetadata) {
  DcpInput input;
  const std::string data_only = MakeTempDir("dcp_no_md");
  WriteAll(data_only + "/__0_0.distcp", "");
  absl::StatusOr<InputModel> model = input.Read(data_only, {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound) << model.status();
  EXPECT_NE(model.status().message().find(".metadata"), std::string::npos) << model.status();
  const std::string rank_local = MakeTempDir("dcp_rank_md");
  WriteAll(rank_local + "/__0.metadata", "");
  WriteAll(rank_local + "/__0_0.distcp", "");
  model = input.Read(rank_local, {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented) << model.status();
  // A .metadata that is not a pickle.
  const std::string garbage = MakeTempDir("dcp_garbage");
  WriteAll(garbage + "/.metadata", "not a pickle");
  model = input.Read(garbage, {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  EXPECT_NE(model.status().message().find(".metadata"), std::string::npos) << model.status();
}

}  // namespace
}  // namespace reshard
