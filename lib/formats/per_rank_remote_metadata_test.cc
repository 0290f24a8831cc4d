// The metadata of verl, FSDP1, OLMo-sharded and ColossalAI saves with many ranks, read from
// remote storage (an in-memory store whose every range read waits a round trip): the ranks'
// files are read several at once, in a bounded number of requests per file, and cataloged in
// rank order.

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/engine/testing/remote_metadata_measure.h"
#include "lib/formats/colossalai/colossalai_fixture.h"
#include "lib/formats/fsdp/fsdp1_fixture.h"
#include "lib/formats/fsdp/olmo_sharded_fixture.h"
#include "lib/formats/fsdp/verl_fixture.h"
#include "lib/io/kvstore/memory_driver.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 64;

struct Layout {
  std::string name;
  std::function<std::map<std::string, std::string>(int)> files;
  // Rank r's file holding its row of "w", relative to the save folder.
  std::function<std::string(int)> rank_file;
  int files_per_rank = 1;

  friend void PrintTo(const Layout& layout, std::ostream* out) { *out << layout.name; }
};

std::vector<Layout> Layouts() {
  return {
      {"Verl", VerlSaveFiles,
       [](int r) { return absl::StrCat("model_world_size_", kRanks, "_rank_", r, ".pt"); }},
      {"Fsdp1", Fsdp1SaveFiles, [](int r) { return absl::StrCat("model_rank", r, ".pt"); }},
      {"OlmoSharded", OlmoShardedSaveFiles,
       [](int r) { return absl::StrCat("model/rank", r, ".pt"); }},
      // Every rank's metadata file, then the weight files they name.
      {"Colossal", ColossalSaveFiles,
       [](int r) { return absl::StrFormat("pytorch_model-dist-%05d.safetensors", r); }, 2},
  };
}

class PerRankRemoteMetadataTest : public testing::TestWithParam<Layout> {
 protected:
  // A fresh save of kRanks ranks at a URL of its own, not yet read.
  std::string Url(const std::string& name) {
    files_ = GetParam().files(kRanks);
    return absl::StrCat("mem://rank-metadata/", name, "-", GetParam().name);
  }

  // LoadInput of the save at `url`, every read waiting 5 ms.
  MetadataLoad Load(const std::string& url) {
    return UploadAndMeasure(url, files_, absl::Milliseconds(5),
                            absl::StrCat(GetParam().name, ", ", kRanks, " ranks"));
  }

  std::string RankFile(const std::string& url, int rank) {
    return absl::StrCat(url, "/", GetParam().rank_file(rank));
  }

  std::map<std::string, std::string> files_;
};

TEST_P(PerRankRemoteMetadataTest, RankFilesReadConcurrentlyInRankOrder) {
  const std::string url = Url("concurrent");
  const MetadataLoad load = Load(url);
  ASSERT_TRUE(load.loaded.ok()) << load.loaded.status();
  EXPECT_GE(load.max_concurrent_reads, 8);
  EXPECT_LE(load.max_concurrent_reads, 16);
  // Three range reads per file at most (the zip's end, its local headers, data.pkl), the
  // lowest rank's file once more for detection, and OLMo's metadata.yaml.
  const int files_per_rank = GetParam().files_per_rank;
  EXPECT_LE(load.reads, 3 * (files_per_rank * kRanks + 1) + 1);

  // Rank r's row of "w" is in rank r's file.
  const Catalog& catalog = load.loaded->catalog;
  const int w = catalog.Find("w");
  ASSERT_GE(w, 0);
  EXPECT_EQ(catalog.tensors[w].shape, (Shape{kRanks, 8}));
  std::vector<std::pair<int64_t, std::string>> rows;
  for (int rank = 0; rank < kRanks; ++rank) rows.emplace_back(rank, RankFile(url, rank));
  EXPECT_EQ(PieceRowsAndFiles(catalog, "w"), rows);
}

// Two ranks' files cannot be read: the error names the lower rank's file (the one a reading in
// rank order meets first), and no rank file far past it is read.
TEST_P(PerRankRemoteMetadataTest, FirstFailedRankNamedAndTheRestNotRead) {
  const std::string url = Url("failing");
  kvstore::GetMemoryDriver().Fail(RankFile(url, 40), absl::UnavailableError("503 Slow Down"));
  kvstore::GetMemoryDriver().Fail(RankFile(url, 10), absl::PermissionDeniedError("403 Forbidden"));
  const MetadataLoad load = Load(url);
  const int files_per_rank = GetParam().files_per_rank;
  ASSERT_FALSE(load.loaded.ok());
  EXPECT_EQ(load.loaded.status().code(), absl::StatusCode::kPermissionDenied)
      << load.loaded.status();
  EXPECT_THAT(load.loaded.status().message(), HasSubstr(RankFile(url, 10)))
      << load.loaded.status();
  // Ranks 0..10 read, and at most 16 files ahead of rank 10 started, three reads each
  // (ColossalAI: every rank's metadata file first).
  EXPECT_LE(load.reads, 3 * (11 + 16) + 3 + 1 + (files_per_rank - 1) * kRanks) << load.reads;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PerRankRemoteMetadataTest, testing::ValuesIn(Layouts()),
                         [](const testing::TestParamInfo<Layout>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace reshard
