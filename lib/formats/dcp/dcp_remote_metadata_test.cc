// A DCP checkpoint with one data file per rank, many ranks, read from remote storage (an
// in-memory store whose every range read waits a round trip): the data files' item headers are
// fetched several files at once, in a bounded number of requests per file, and the chunks are
// cataloged in file order.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/engine/testing/remote_metadata_measure.h"
#include "lib/formats/dcp/dcp_fixture.h"
#include "lib/formats/format_fixture.h"

namespace reshard {
namespace {

using namespace dcp_testing;  // NOLINT: the pickle fragments read as a notation

constexpr int kRanks = 64;

std::string DataFile(int rank) { return absl::StrCat("__", rank, "_0.distcp"); }

// Tensor "w" F32 [kRanks, 2], row r (FixtureF32Bytes(2, r)) saved by rank r in its own file.
std::map<std::string, std::string> DcpSaveFiles() {
  std::map<std::string, std::string> files;
  std::vector<std::string> chunks;
  std::vector<std::pair<std::string, std::string>> storage;
  for (int rank = 0; rank < kRanks; ++rank) {
    const TorchSaveFile item = TensorItem("FloatStorage", 2, {1, 2}, FixtureF32Bytes(2, rank));
    files[DataFile(rank)] = item.bytes;
    chunks.push_back(Chunk({rank, 0}, {1, 2}));
    const std::vector<int64_t> offsets = {rank, 0};
    storage.emplace_back(Index("w", &offsets, rank),
                         Info(DataFile(rank), 0, static_cast<int64_t>(item.bytes.size())));
  }
  files[".metadata"] = Metadata(
      Dict({{Str("w"), TensorMd(Properties("float32"), {kRanks, 2}, chunks)}}), Dict(storage));
  return files;
}

TEST(DcpRemoteMetadataTest, DataFilesReadConcurrentlyInOrder) {
  const std::string url = "mem://dcp-metadata/save";
  const MetadataLoad load = UploadAndMeasure(url, DcpSaveFiles(), absl::Milliseconds(5),
                                             absl::StrCat("DCP, ", kRanks, " data files"));
  ASSERT_TRUE(load.loaded.ok()) << load.loaded.status();
  EXPECT_GE(load.max_concurrent_reads, 8);
  EXPECT_LE(load.max_concurrent_reads, 16);
  // Three range reads per data file at most, and one for .metadata.
  EXPECT_LE(load.reads, 3 * kRanks + 1);

  std::vector<std::pair<int64_t, std::string>> expected;
  for (int rank = 0; rank < kRanks; ++rank) {
    expected.emplace_back(rank, absl::StrCat(url, "/", DataFile(rank)));
  }
  EXPECT_EQ(PieceRowsAndFiles(load.loaded->catalog, "w"), expected);
}

}  // namespace
}  // namespace reshard
