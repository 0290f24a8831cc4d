#include "lib/formats/checkpoint_folder.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

TEST(JoinPathTest, OneSlashBetween) {
  EXPECT_EQ(JoinPath("save", "latest"), "save/latest");
  EXPECT_EQ(JoinPath("save/", "latest"), "save/latest");
  EXPECT_EQ(JoinPath("", "latest"), "latest");
  EXPECT_EQ(JoinPath("/", "latest"), "/latest");
}

TEST(BaseNameTest, IgnoresTrailingSlashes) {
  EXPECT_EQ(BaseName("save/global_step5"), "global_step5");
  EXPECT_EQ(BaseName("save/global_step5//"), "global_step5");
  EXPECT_EQ(BaseName("global_step5"), "global_step5");
  EXPECT_EQ(BaseName("/global_step5/"), "global_step5");
  EXPECT_EQ(BaseName("/"), "");
}

TEST(TagTest, OnePlainComponent) {
  for (const char* good : {"global_step5", "iter_0000100", "release", "v1.0", ".hidden"}) {
    EXPECT_TRUE(IsPlainPathComponent(good)) << good;
    EXPECT_TRUE(IsPlainTag(good)) << good;
    EXPECT_TRUE(CheckTag(good, "from --tag").ok()) << good;
  }
  // Plain file names, but no tags: ".." anywhere is refused in a tag.
  for (const char* dotdot : {"step..1", "..a", "a.."}) {
    EXPECT_TRUE(IsPlainPathComponent(dotdot)) << dotdot;
    EXPECT_FALSE(IsPlainTag(dotdot)) << dotdot;
    EXPECT_EQ(CheckTag(dotdot, "from --tag").code(), absl::StatusCode::kInvalidArgument) << dotdot;
  }
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "../x", "a/b", "/abs", "dir/",
                                std::string("a\0b", 3), std::string(256, 'a')}) {
    EXPECT_FALSE(IsPlainPathComponent(bad)) << bad;
    EXPECT_FALSE(IsPlainTag(bad)) << bad;
    const absl::Status status = CheckTag(bad, "from --tag");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("(from --tag) is not a plain folder name"), std::string::npos)
        << status;
  }
  EXPECT_TRUE(IsPlainPathComponent(std::string(kMaxPathComponentBytes, 'a')));
}

TEST(TrackerFileTest, ReadsStrippedContents) {
  const std::string dir = MakeTempDir("tracker");
  WriteAll(JoinPath(dir, kDeepSpeedTrackerName), "global_step10\n");
  auto tag = ReadTrackerFile(JoinPath(dir, kDeepSpeedTrackerName));
  ASSERT_TRUE(tag.ok()) << tag.status();
  ASSERT_TRUE(tag->has_value());
  EXPECT_EQ(**tag, "global_step10");
}

TEST(TrackerFileTest, AbsentIsNullopt) {
  const std::string dir = MakeTempDir("tracker_absent");
  auto tracker = ReadTrackerFile(JoinPath(dir, kMegatronTrackerName));
  ASSERT_TRUE(tracker.ok()) << tracker.status();
  EXPECT_FALSE(tracker->has_value());
}

TEST(TrackerFileTest, RefusesLargerThanTheLimitRatherThanTruncating) {
  const std::string dir = MakeTempDir("tracker_large");
  const std::string path = JoinPath(dir, kMegatronTrackerName);
  WriteAll(path, std::string(kMaxTrackerFileBytes, ' '));
  auto at_limit = ReadTrackerFile(path);
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->value_or("?"), "");
  // "100" followed by padding: a truncating reader would have read 100.
  WriteAll(path, "100" + std::string(kMaxTrackerFileBytes, ' '));
  auto too_large = ReadTrackerFile(path);
  EXPECT_EQ(too_large.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(too_large.status().message().find(path), std::string::npos) << too_large.status();
}

TEST(TrackerFileTest, RefusesAFolder) {
  const std::string dir = MakeTempDir("tracker_folder");
  const std::string path = JoinPath(dir, kDeepSpeedTrackerName);
  const std::string inner = MakeTempDir("tracker_folder_inner");
  ASSERT_EQ(std::rename(inner.c_str(), path.c_str()), 0);
  EXPECT_EQ(ReadTrackerFile(path).status().code(), absl::StatusCode::kDataLoss);
}

TEST(AppendCatalogTest, RebasesFileIndices) {
  Catalog target;
  target.files.push_back(SourceFile{"a.bin"});
  target.tensors.push_back(CatalogTensor{"a", DType::kF32, {2}, {SourcePiece{}}});
  Catalog source;
  source.files.push_back(SourceFile{"b.bin"});
  source.files.push_back(SourceFile{"c.bin"});
  SourcePiece second;
  second.file = 1;
  source.tensors.push_back(CatalogTensor{"c", DType::kF32, {2}, {second}});
  source.metadata["format"] = "pt";
  source.other_entries.push_back("note");
  AppendCatalog(target, std::move(source));
  ASSERT_EQ(target.files.size(), 3u);
  EXPECT_EQ(target.files[2].path, "c.bin");
  ASSERT_EQ(target.tensors.size(), 2u);
  EXPECT_EQ(target.tensors[0].pieces[0].file, 0);
  EXPECT_EQ(target.tensors[1].pieces[0].file, 2);
  EXPECT_EQ(target.metadata.at("format"), "pt");
  EXPECT_EQ(target.other_entries, std::vector<std::string>{"note"});
}

}  // namespace
}  // namespace reshard
