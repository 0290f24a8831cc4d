#include "lib/formats/nemo/nemo_format.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/formats/format.h"
#include "lib/formats/nemo/tar_writer.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/plan/partition_rules.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

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

TEST(NemoInputTest, ADistributedCheckpointInsideTheArchiveSaysWhatToDo) {
  const std::string dir = MakeTempDir("nemo");
  const tar_testing::Built tar = tar_testing::BuildTar(
      {{"./model_config.yaml", "tensor_model_parallel_size: 1\n"},
       {"./model_weights/metadata.json", "{\"sharded_backend\": \"zarr\"}"}});
  WriteAll(dir + "/m.nemo", tar.bytes);
  absl::StatusOr<InputModel> model = NemoInput().Read(dir + "/m.nemo", {});
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(model.status().message(), HasSubstr("a Zarr-backend distributed checkpoint"));
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
