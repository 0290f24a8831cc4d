#include "lib/formats/nemo/nemo_format.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/formats/dcp/dcp_fixture.h"
#include "lib/formats/format.h"
#include "lib/formats/nemo/tar_writer.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/plan/partition_rules.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::vector<std::string> kNames = {"model.decoder.final_layernorm.weight",
                                         "model.decoder.final_layernorm.bias",
                                         "model.embedding.position_embeddings.step"};

std::string Ckpt(float first = 1.5f) {
  PickleWriter p;
  WriteFixtureStateDict(p, kNames);
  return BuildTorchSave(p.Finish(), FixtureStateDictStorages(first)).bytes;
}

TEST(NemoInputTest, IdAndProbePriority) {
  const NemoInput input;
  EXPECT_EQ(input.id(), "nemo");
  EXPECT_EQ(input.probe_priority(), 50);
}

TEST(NemoInputTest, ReadsOneCkptInPlaceAtItsOffsetInTheArchive) {
  const std::string dir = MakeTempDir("nemo");
  const tar_testing::Built tar = tar_testing::BuildTar(
      {{"./model_config.yaml", "tensor_model_parallel_size: 1\n"},
       {"./0123456789abcdef0123456789abcdef_vocab.json", "{}"},
       {"./model_weights.ckpt", Ckpt()}});
  WriteAll(dir + "/m.nemo", tar.bytes);
  const NemoInput input;
  ASSERT_EQ(input.Probe(dir + "/m.nemo").value_or(false), true);
  absl::StatusOr<InputModel> model = input.Read(dir + "/m.nemo", {});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->parts.size(), 1u);
  const Catalog& catalog = model->parts[0];
  ASSERT_EQ(catalog.files.size(), 1u);
  EXPECT_EQ(catalog.files[0].path, dir + "/m.nemo");
  EXPECT_EQ(catalog.files[0].size, tar.bytes.size());
  ASSERT_EQ(catalog.tensors.size(), 3u);
  EXPECT_EQ(catalog.tensors[0].name, kNames[0]);
  // The first tensor's bytes, read where the catalog says, are the fixture's.
  const SourcePiece& piece = catalog.tensors[0].pieces[0];
  EXPECT_GT(piece.byte_offset, tar.data_offsets[2]);
  EXPECT_EQ(tar.bytes.substr(piece.byte_offset, 48), FixtureF32Bytes(12, 1.5f));
  for (const ChecksummedRange& range : catalog.files[0].checksummed) {
    EXPECT_GE(range.offset, tar.data_offsets[2]);
  }
  EXPECT_EQ(model->description,
            "NeMo 1 archive, TP1 x PP1, one model_weights.ckpt, 0 layers; tokenizer and other "
            "files: vocab.json");
}

TEST(NemoInputTest, MissingRankNamesTheMember) {
  const std::string dir = MakeTempDir("nemo");
  const tar_testing::Built tar = tar_testing::BuildTar(
      {{"./model_config.yaml", "tensor_model_parallel_size: 2\npipeline_model_parallel_size: 1\n"},
       {"./mp_rank_00/model_weights.ckpt", Ckpt()}});
  WriteAll(dir + "/m.nemo", tar.bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(dir + "/m.nemo", {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(model.status().message(),
            dir + "/m.nemo: NeMo 1 TP2 x PP1 (model_config.yaml): member "
                  "mp_rank_01/model_weights.ckpt is missing");
}

TEST(NemoInputTest, ASymlinkAsWeightsIsRefused) {
  const std::string dir = MakeTempDir("nemo");
  const tar_testing::Built tar = tar_testing::BuildTar(
      {{"./model_config.yaml", "tensor_model_parallel_size: 1\n"},
       {"./model_weights.ckpt", "", '2', "/etc/passwd"}});
  WriteAll(dir + "/m.nemo", tar.bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(dir + "/m.nemo", {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(),
              HasSubstr("m.nemo member model_weights.ckpt is a symbolic link to \"/etc/passwd\""));
}

// A `.nemo` whose weights are a model_weights/ torch_dist folder of 2 ranks: "w" F32 [4, 3]
// split by rows (rank r holds rows 2r, 2r + 1), each chunk one torch.save item of its rank's
// __r_0.distcp. `files` (by member name) replace or drop (empty) members.
tar_testing::Built DistArchive(std::map<std::string, std::string> files = {}) {
  using namespace dcp_testing;  // NOLINT: the pickle fragments
  const std::string rows = FixtureF32Bytes(12, 1.5f);
  std::vector<std::pair<std::string, std::string>> storage;
  std::vector<std::string> chunks;
  std::map<std::string, std::string> members = {
      {"./model_config.yaml",
       "tensor_model_parallel_size: 2\npipeline_model_parallel_size: 1\nnum_layers: 0\n"},
      {"./0123456789abcdef0123456789abcdef_tokenizer.model", "tok"},
      {"./model_weights/metadata.json",
       R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})"},
  };
  for (int rank = 0; rank < 2; ++rank) {
    const std::string name = absl::StrCat("__", rank, "_0.distcp");
    const TorchSaveFile item = TensorItem("FloatStorage", 6, {2, 3}, rows.substr(rank * 24, 24));
    const std::vector<int64_t> offsets = {2 * rank, 0};
    storage.push_back(
        {Index("model.w", &offsets, rank), Info(name, 0, static_cast<int64_t>(item.bytes.size()))});
    chunks.push_back(Chunk({2 * rank, 0}, {2, 3}));
    members["./model_weights/" + name] = item.bytes;
  }
  members["./model_weights/.metadata"] =
      Metadata(Dict({{Str("model.w"), TensorMd(Properties("float32", kMd), {4, 3}, chunks)}}),
               Dict(storage));
  for (auto& [name, data] : files) {
    if (data.empty()) {
      members.erase(name);
    } else {
      members[name] = data;
    }
  }
  std::vector<tar_testing::Member> list = {{"./", "", '5'}, {"./model_weights", "", '5'}};
  for (auto& [name, data] : members) list.push_back({name, data});
  return tar_testing::BuildTar(list);
}

TEST(NemoInputTest, ReadsATorchDistFolderInsideTheArchiveInPlace) {
  const std::string dir = MakeTempDir("nemo");
  const tar_testing::Built tar = DistArchive();
  WriteAll(dir + "/m.nemo", tar.bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(dir + "/m.nemo", {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->format, "nemo");
  EXPECT_THAT(model->description,
              StartsWith("NeMo 1 archive, torch_dist weights (model_weights/), TP2 x PP1, 0 "
                         "layers; tokenizer and other files: tokenizer.model; Megatron-Core "
                         "torch_dist, model_weights; PyTorch DCP, 2 ranks"));
  ASSERT_EQ(model->parts.size(), 1u);
  const Catalog& catalog = model->parts[0];
  EXPECT_EQ(catalog.format, "nemo");
  // One file, the archive itself: the conversion reads it, never a tar:// path.
  ASSERT_EQ(catalog.files.size(), 1u);
  EXPECT_EQ(catalog.files[0].path, dir + "/m.nemo");
  EXPECT_EQ(catalog.files[0].size, tar.bytes.size());
  EXPECT_FALSE(catalog.files[0].checksummed.empty());
  ASSERT_EQ(catalog.tensors.size(), 1u);
  const CatalogTensor& w = catalog.tensors[0];
  EXPECT_EQ(w.name, "model.w");
  EXPECT_EQ(w.shape, (Shape{4, 3}));
  ASSERT_EQ(w.pieces.size(), 2u);
  // Each rank's rows, read where the catalog places them in the archive, are the fixture's.
  const std::string rows = FixtureF32Bytes(12, 1.5f);
  for (const SourcePiece& piece : w.pieces) {
    EXPECT_EQ(piece.file, 0);
    const int64_t row = piece.box.origin[0];
    EXPECT_EQ(tar.bytes.substr(piece.byte_offset, 24), rows.substr(row * 12, 24)) << row;
  }
  // Nothing stays mounted: the members' paths name nothing once the read is done.
  absl::StatusOr<bool> exists =
      CheckInputExists("tar://" + dir + "/m.nemo!/model_weights/.metadata");
  ASSERT_TRUE(exists.ok()) << exists.status();
  EXPECT_FALSE(*exists);
}

TEST(NemoInputTest, ReadsATorchDistFolderInsideARemoteArchive) {
  const tar_testing::Built tar = DistArchive();
  const std::string url = "mem://nemo-dist/m.nemo";
  kvstore::GetMemoryDriver().Put(url, tar.bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(url, {});
  ASSERT_TRUE(model.ok()) << model.status();
  const Catalog& catalog = model->parts[0];
  ASSERT_EQ(catalog.files.size(), 1u);
  EXPECT_EQ(catalog.files[0].path, url);
  // The conversion reads the version whose metadata was read.
  EXPECT_EQ(catalog.files[0].version, kvstore::GetMemoryDriver().version(url));
  ASSERT_EQ(catalog.tensors.size(), 1u);
  const SourcePiece& piece = catalog.tensors[0].pieces[0];
  EXPECT_EQ(tar.bytes.substr(piece.byte_offset, 24),
            FixtureF32Bytes(12, 1.5f).substr(piece.box.origin[0] * 12, 24));
}

TEST(NemoInputTest, AMetadataNamingAMissingMemberNamesTheArchiveAndMember) {
  const std::string dir = MakeTempDir("nemo");
  WriteAll(dir + "/m.nemo", DistArchive({{"./model_weights/__1_0.distcp", ""}}).bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(dir + "/m.nemo", {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  const std::string root = "tar://" + dir + "/m.nemo!";
  EXPECT_EQ(model.status().message(),
            dir +
                "/m.nemo: NeMo 1 TP2 x PP1 (model_config.yaml): model_weights/: Megatron-Core "
                "torch_dist checkpoint " +
                root + "/model_weights: " + root +
                "/model_weights/.metadata: tensor \"model.w\", chunk 1 [2:4, 0:3]: " + root +
                "/model_weights/__1_0.distcp: data file \"__1_0.distcp\" is missing");
}

TEST(NemoInputTest, AZarrBackendCheckpointIsRefusedSayingWhy) {
  const std::string dir = MakeTempDir("nemo");
  const tar_testing::Built tar = tar_testing::BuildTar(
      {{"./model_config.yaml", "tensor_model_parallel_size: 1\n"},
       {"./model_weights/metadata.json", "{\"sharded_backend\": \"zarr\"}"}});
  WriteAll(dir + "/m.nemo", tar.bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(dir + "/m.nemo", {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(model.status().message()),
              StartsWith(dir + "/m.nemo member model_weights/metadata.json: a Zarr-backend "
                               "distributed checkpoint, which reshard does not read: "));
}

TEST(NemoInputTest, ATarWithoutNemoMembersIsNotANemoArchive) {
  const std::string dir = MakeTempDir("nemo");
  WriteAll(dir + "/x.tar", tar_testing::BuildTar({{"./notes.txt", "hello"}}).bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(dir + "/x.tar", {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(),
            dir + "/x.tar: a tar archive, but not a NeMo 1 archive (neither model_config.yaml "
                  "nor weights in it)");
}

TEST(NemoInputTest, PartitionRulesCoverMegatronCoreNames) {
  absl::StatusOr<PartitionRules> rules = PartitionRules::Create(NemoPartitionRules(true, 12));
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto match = [&](const std::string& name) { return *rules->Match(name).value(); };
  const PartitionRule qkv = match("model.decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv.split_dim, 0);
  EXPECT_EQ(qkv.unit, 12);
  EXPECT_EQ(match("model.decoder.layers.0.mlp.linear_fc1.weight").fused, 2);
  EXPECT_EQ(match("model.decoder.layers.0.mlp.linear_fc2.weight").split_dim, 1);
  EXPECT_TRUE(match("model.decoder.layers.0.mlp.linear_fc1.layer_norm_weight").replicate);
  EXPECT_TRUE(match("model.decoder.layers.0.self_attention.core_attention._extra_state").replicate);
  EXPECT_TRUE(match("model.decoder.final_layernorm.weight").replicate);
  EXPECT_EQ(match("model.language_model.encoder.layers.0.mlp.dense_h_to_4h.weight").fused, 2);
  EXPECT_EQ(match("model.output_layer.weight").split_dim, 0);
}

TEST(NemoInputTest, StripsArtifactHashes) {
  EXPECT_EQ(StripArtifactHash("0123456789abcdef0123456789abcdef_tokenizer.model"),
            "tokenizer.model");
  EXPECT_EQ(StripArtifactHash("tokenizer.model"), "tokenizer.model");
  EXPECT_EQ(StripArtifactHash("0123456789ABCDEF0123456789abcdef_x"),
            "0123456789ABCDEF0123456789abcdef_x");
}

}  // namespace
}  // namespace reshard
