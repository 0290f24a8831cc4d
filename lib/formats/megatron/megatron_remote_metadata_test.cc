// The rank files of a Megatron-LM save with many tensor-parallel ranks, read from remote storage
// (an in-memory store whose every range read waits a round trip): read several at once, in a
// bounded number of requests per file, and merged in rank order.

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/engine/testing/remote_metadata_measure.h"
#include "lib/formats/megatron/megatron_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"

namespace reshard {
namespace {

constexpr int kRanks = 64;
constexpr char kEmbeddings[] = "language_model.embedding.word_embeddings.weight";

std::string RankFolder(int rank) { return absl::StrFormat("iter_0000001/mp_rank_%02d", rank); }

// A Megatron-LM save of kRanks TP ranks (PP 1): each rank's `model` holds its 4 rows of the word
// embeddings and the final norm (lib/formats/torch/torch_fixture.h), `args` the topology.
std::map<std::string, std::string> MegatronSaveFiles() {
  PickleWriter p;
  p.BeginDict(false);
  p.String("model");
  WriteFixtureStateDict(p, {kEmbeddings, "language_model.encoder.final_layernorm.weight",
                            "language_model.encoder.final_layernorm.bias"});
  p.String("args");
  p.BeginDict(false);
  p.String("tensor_model_parallel_size");
  p.Int(kRanks);
  p.String("pipeline_model_parallel_size");
  p.Int(1);
  p.EndDict();
  WriteMegatronVersionAndIteration(p);
  const std::string pickle = p.Finish();
  std::map<std::string, std::string> files;
  files["latest_checkpointed_iteration.txt"] = "1";
  for (int rank = 0; rank < kRanks; ++rank) {
    files[RankFolder(rank) + "/model_optim_rng.pt"] =
        BuildTorchSave(pickle, FixtureStateDictStorages(1.5f + 100.0f * rank)).bytes;
  }
  return files;
}

TEST(MegatronRemoteMetadataTest, RankFilesReadConcurrentlyInRankOrder) {
  const std::string url = "mem://megatron-metadata/save";
  const MetadataLoad load = UploadAndMeasure(url, MegatronSaveFiles(), absl::Milliseconds(5),
                                             absl::StrCat("Megatron-LM, TP ", kRanks));
  ASSERT_TRUE(load.loaded.ok()) << load.loaded.status();
  EXPECT_GE(load.max_concurrent_reads, 8);
  EXPECT_LE(load.max_concurrent_reads, 16);
  // Three range reads per rank file at most, and one for the tracker file.
  EXPECT_LE(load.reads, 3 * kRanks + 1);

  // The embeddings' rows: rank r's 4 rows from rank r's file.
  const int embeddings = load.loaded->catalog.Find(kEmbeddings);
  ASSERT_GE(embeddings, 0);
  EXPECT_EQ(load.loaded->catalog.tensors[embeddings].shape, (Shape{4 * kRanks, 3}));
  std::vector<std::pair<int64_t, std::string>> expected;
  for (int rank = 0; rank < kRanks; ++rank) {
    expected.emplace_back(4 * rank,
                          absl::StrCat(url, "/", RankFolder(rank), "/model_optim_rng.pt"));
  }
  EXPECT_EQ(PieceRowsAndFiles(load.loaded->catalog, kEmbeddings), expected);
}

}  // namespace
}  // namespace reshard
