#include "lib/formats/nemo/tar_archive.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/formats/nemo/tar_writer.h"
#include "lib/io/byte_source.h"

namespace reshard {
namespace {

using tar_testing::BuildTar;
using tar_testing::Member;
using ::testing::HasSubstr;

absl::StatusOr<TarArchive> ParseBytes(const std::string& bytes) {
  ViewByteSource source(bytes, "m.nemo");
  return TarArchive::Parse(source);
}

TEST(TarArchiveTest, ListsMembersWithTheirDataOffsets) {
  const std::string long_name = std::string(120, 'a') + "/model_weights.ckpt";
  const tar_testing::Built built = BuildTar({
      {"./", "", '5'},
      {"./model_config.yaml", "tensor_model_parallel_size: 1\n"},
      {"./mp_rank_00", "", '5'},
      {long_name, std::string(700, 'x'), '0', "", /*gnu_long_name=*/true},
      {"./" + long_name + "2", "pax", '0', "", /*gnu_long_name=*/false},
  });
  absl::StatusOr<TarArchive> tar = ParseBytes(built.bytes);
  ASSERT_TRUE(tar.ok()) << tar.status();
  ASSERT_EQ(tar->members().size(), 4u);
  const TarMember* config = tar->Find("model_config.yaml");
  ASSERT_NE(config, nullptr);
  EXPECT_EQ(config->data_offset, built.data_offsets[1]);
  EXPECT_EQ(config->size, 30u);
  EXPECT_EQ(tar->Find("mp_rank_00")->kind, TarMember::Kind::kFolder);
  const TarMember* gnu = tar->Find(long_name);
  ASSERT_NE(gnu, nullptr);
  EXPECT_EQ(gnu->data_offset, built.data_offsets[3]);
  EXPECT_EQ(gnu->header_offset, built.header_offsets[3]);
  EXPECT_EQ(gnu->size, 700u);
  const TarMember* pax = tar->Find(long_name + "2");
  ASSERT_NE(pax, nullptr);
  EXPECT_EQ(built.bytes.substr(pax->data_offset, pax->size), "pax");
  EXPECT_TRUE(tar->File("model_config.yaml").ok());
}

TEST(TarArchiveTest, ReadsThroughRangeReads) {
  const tar_testing::Built built = BuildTar({{"./a", "1"}, {"./b", std::string(5000, 'b')}});
  RangeReadSource source("s3://bucket/m.nemo", built.bytes.size(),
                         [&](uint64_t offset, absl::Span<char> out) {
                           built.bytes.copy(out.data(), out.size(), offset);
                           return absl::OkStatus();
                         });
  absl::StatusOr<TarArchive> tar = TarArchive::Parse(source);
  ASSERT_TRUE(tar.ok()) << tar.status();
  EXPECT_EQ(tar->Find("b")->data_offset, built.data_offsets[1]);
}

TEST(TarArchiveTest, TruncatedInsideAMemberNamesItAndTheOffset) {
  const tar_testing::Built built =
      BuildTar({{"./model_config.yaml", "x"}, {"./model_weights.ckpt", std::string(4000, 'w')}});
  const std::string cut = built.bytes.substr(0, built.data_offsets[1] + 1000);
  absl::StatusOr<TarArchive> tar = ParseBytes(cut);
  EXPECT_EQ(tar.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(tar.status().message(),
              HasSubstr(absl::StrCat("m.nemo: truncated archive: member ./model_weights.ckpt "
                                     "(header at byte offset ",
                                     built.header_offsets[1], ") has 4000 bytes from byte offset ",
                                     built.data_offsets[1], " but the archive ends at byte offset ",
                                     cut.size())));
}

TEST(TarArchiveTest, TruncatedAtAMemberBoundaryIsRefused) {
  const tar_testing::Built built = BuildTar({{"./model_config.yaml", "x"}});
  const std::string cut = built.bytes.substr(0, 1024);  // header + data, no end blocks
  absl::StatusOr<TarArchive> tar = ParseBytes(cut);
  EXPECT_EQ(tar.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(tar.status().message(),
              HasSubstr("truncated archive: it ends at byte offset 1024 where a header or the "
                        "end-of-archive block should be (after member model_config.yaml)"));
}

TEST(TarArchiveTest, MemberLeavingTheArchiveIsRefused) {
  for (const std::string name : {"../evil.ckpt", "./a/../../b", "/etc/passwd"}) {
    const tar_testing::Built built = BuildTar({{"./ok", "1"}, {name, "2"}});
    absl::StatusOr<TarArchive> tar = ParseBytes(built.bytes);
    EXPECT_EQ(tar.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(tar.status().message(),
                HasSubstr(absl::StrCat("m.nemo: header at byte offset ", built.header_offsets[1],
                                       ": member \"", name, "\"")));
  }
}

TEST(TarArchiveTest, DuplicateMembersAreRefused) {
  const tar_testing::Built built = BuildTar({{"./a/b", "1"}, {"a//b", "2"}});
  absl::StatusOr<TarArchive> tar = ParseBytes(built.bytes);
  EXPECT_EQ(tar.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tar.status().message(),
              HasSubstr("m.nemo: member a/b appears twice (headers at byte offsets 0 and 1024)"));
}

TEST(TarArchiveTest, LinksAreListedButAreNotFiles) {
  const tar_testing::Built built = BuildTar(
      {{"./real.ckpt", "1"}, {"./model_weights.ckpt", "", '2', "/etc/passwd"},
       {"./hard.ckpt", "", '1', "real.ckpt"}});
  absl::StatusOr<TarArchive> tar = ParseBytes(built.bytes);
  ASSERT_TRUE(tar.ok()) << tar.status();
  absl::StatusOr<const TarMember*> link = tar->File("model_weights.ckpt");
  EXPECT_EQ(link.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(link.status().message(),
              HasSubstr("m.nemo member model_weights.ckpt is a symbolic link to \"/etc/passwd\", "
                        "not a file"));
  EXPECT_THAT(tar->File("hard.ckpt").status().message(), HasSubstr("is a hard link"));
  EXPECT_EQ(tar->File("missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(TarArchiveTest, BadChecksumAndSizeFieldsAreDataLoss) {
  tar_testing::Built built = BuildTar({{"./a", "1"}});
  std::string flipped = built.bytes;
  flipped[10] ^= 1;
  EXPECT_THAT(ParseBytes(flipped).status().message(),
              HasSubstr("m.nemo: header at byte offset 0"));
  EXPECT_EQ(ParseBytes(flipped).status().code(), absl::StatusCode::kDataLoss);
  // A size field that is not octal, with a checksum that matches it.
  std::string header = tar_testing::TarHeader("./a", 1, '0');
  header[124] = '9';
  header.replace(148, 8, "        ");
  unsigned sum = 0;
  for (unsigned char c : header) sum += c;
  char digits[8];
  std::snprintf(digits, sizeof(digits), "%06o", sum);
  header.replace(148, 7, digits, 7);
  EXPECT_THAT(ParseBytes(header + std::string(1536, '\0')).status().message(),
              HasSubstr("malformed size field"));
}

TEST(TarArchiveTest, SizesPastTheArchiveAreRefusedWithoutReadingThem) {
  // A size of 4 GiB in a 2 KiB archive.
  std::string header = tar_testing::TarHeader("./big", uint64_t{1} << 32, '0');
  absl::StatusOr<TarArchive> tar = ParseBytes(header + std::string(1536, '\0'));
  EXPECT_EQ(tar.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(tar.status().message(), HasSubstr("has 4294967296 bytes from byte offset 512"));
}

TEST(TarArchiveTest, NormalizesNames) {
  EXPECT_EQ(*NormalizeTarName("./a//b/./c/"), "a/b/c");
  EXPECT_EQ(*NormalizeTarName("./"), "");
  EXPECT_FALSE(NormalizeTarName("a/../b").ok());
}

}  // namespace
}  // namespace reshard
