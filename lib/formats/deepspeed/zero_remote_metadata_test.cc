// The metadata of a ZeRO save with many ranks, read from remote storage (an in-memory store
// whose every range read waits a round trip): the ranks' files are read several at once, in a
// bounded number of requests per file, and the model is the same as read one file at a time.

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/engine/testing/remote_metadata_measure.h"
#include "lib/formats/deepspeed/zero_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/io/kvstore/memory_driver.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 64;

std::string OptimizerFile(const std::string& url, int rank) {
  return absl::StrCat(url, "/global_step5/zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt");
}

class ZeroRemoteMetadataTest : public testing::TestWithParam<int> {
 protected:
  // A fresh save of kRanks ranks at a URL of its own, not yet read.
  std::string Url(const std::string& name) {
    files_ = ZeroSaveFiles(GetParam(), kRanks);
    return absl::StrCat("mem://zero-metadata/", name, "-stage", GetParam());
  }

  // LoadInput of the save at `url`, every read waiting 5 ms.
  MetadataLoad Load(const std::string& url) {
    return UploadAndMeasure(url, files_, absl::Milliseconds(5),
                            absl::StrCat("ZeRO-", GetParam(), ", ", kRanks, " ranks"));
  }

  std::map<std::string, std::string> files_;
};

TEST_P(ZeroRemoteMetadataTest, RankFilesReadConcurrentlyInRankOrder) {
  const std::string url = Url("concurrent");
  const MetadataLoad load = Load(url);
  ASSERT_TRUE(load.loaded.ok()) << load.loaded.status();
  const int files = static_cast<int>(files_.size()) - 1;  // the tag folder's, without `latest`
  EXPECT_GE(load.max_concurrent_reads, 8);
  EXPECT_LE(load.max_concurrent_reads, 16);
  // Three range reads per file at most (the zip's end, its local headers, data.pkl) and one
  // for `latest`.
  EXPECT_LE(load.reads, 3 * files + 1);

  // Rank r's row of "w" is in rank r's optimizer file, and ZeRO-3's "f" in its model states.
  const Catalog& catalog = load.loaded->catalog;
  const int w = catalog.Find("w");
  ASSERT_GE(w, 0);
  EXPECT_EQ(catalog.tensors[w].shape, (Shape{kRanks, 8}));
  std::vector<std::pair<int64_t, std::string>> optimizer_rows, model_rows;
  for (int rank = 0; rank < kRanks; ++rank) {
    optimizer_rows.emplace_back(rank, OptimizerFile(url, rank));
    model_rows.emplace_back(rank, absl::StrCat(url, "/global_step5/zero_pp_rank_", rank,
                                               "_mp_rank_00_model_states.pt"));
  }
  EXPECT_EQ(PieceRowsAndFiles(catalog, "w"), optimizer_rows);
  if (GetParam() == 3) EXPECT_EQ(PieceRowsAndFiles(catalog, "f"), model_rows);
}

// Two ranks' files cannot be read: the error names the lower rank's file (the one a reading in
// rank order meets first), and no rank file past it is read.
TEST_P(ZeroRemoteMetadataTest, FirstFailedRankNamedAndTheRestNotRead) {
  const std::string url = Url("failing");
  kvstore::GetMemoryDriver().Fail(OptimizerFile(url, 40), absl::UnavailableError("503 Slow Down"));
  kvstore::GetMemoryDriver().Fail(OptimizerFile(url, 10),
                                  absl::PermissionDeniedError("403 Forbidden"));
  const MetadataLoad load = Load(url);
  ASSERT_FALSE(load.loaded.ok());
  EXPECT_EQ(load.loaded.status().code(), absl::StatusCode::kPermissionDenied)
      << load.loaded.status();
  EXPECT_THAT(load.loaded.status().message(), HasSubstr(OptimizerFile(url, 10)));
  // Ranks 0..10 read, and at most 16 files ahead of rank 10 started, three reads each.
  EXPECT_LE(load.reads, 3 * (11 + 16) + 3 * 2 + 1) << load.reads;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroRemoteMetadataTest, testing::Values(2, 3),
                         [](const testing::TestParamInfo<int>& info) {
                           return absl::StrCat("Zero", info.param);
                         });

}  // namespace
}  // namespace reshard
