// The fixture of the "nemo" input format (see lib/formats/format_fixture.h): a NeMo 1 archive
// m.nemo (members prefixed "./", as NeMo's tarfile writes them) holding model_config.yaml
// (TP 2, PP 1), a tokenizer file with NeMo's hash prefix, and mp_rank_0{0,1}/model_weights.ckpt,
// each a state dict under Megatron-LM names with NeMo's `model.` prefix; the engine merges the two
// parts with the reader's default rules. Damages: the torch.save damages inside rank 1's member
// (offsets in the archive), and a flipped byte in that member's tar header.
//
// Variant "torch-dist": a NeMo 1 archive whose weights are a model_weights/ torch_dist folder of
// 2 ranks: model.decoder.final_layernorm.weight F32 [4, 3] split by rows (rank r holds rows 2r,
// 2r + 1, one torch.save item of __r_0.distcp). Damages: rank 1's item damaged inside the
// archive, the archive cut inside rank 1's member, a flipped byte in that member's tar header.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/formats/dcp/dcp_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/nemo/tar_writer.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

BuiltFixture BuildNemoFixture(const std::string& dir) {
  // Names the partition rules know: the word embeddings split by rows over the TP ranks, the
  // final norm replicated.
  const std::vector<std::string> names = {"model.language_model.embedding.word_embeddings.weight",
                                          "model.language_model.encoder.final_layernorm.weight",
                                          "model.language_model.encoder.final_layernorm.bias"};
  PickleWriter p;
  WriteFixtureStateDict(p, names);
  const std::string pickle = p.Finish();
  std::vector<TorchSaveFile> ranks;
  std::vector<tar_testing::Member> members = {
      {"./", "", '5'},
      {"./model_config.yaml",
       "mcore_gpt: false\ntensor_model_parallel_size: 2\npipeline_model_parallel_size: 1\n"},
      {"./0123456789abcdef0123456789abcdef_tokenizer.model", "tokenizer"},
  };
  for (int rank = 0; rank < 2; ++rank) {
    // Each rank holds its own rows of the embeddings.
    ranks.push_back(BuildTorchSave(pickle, FixtureStateDictStorages(1.5f + 100.0f * rank)));
    members.push_back({absl::StrCat("./mp_rank_0", rank), "", '5'});
    members.push_back({absl::StrCat("./mp_rank_0", rank, "/model_weights.ckpt"), ranks.back().bytes});
  }
  const tar_testing::Built tar = tar_testing::BuildTar(members);
  WriteAll(dir + "/m.nemo", tar.bytes);
  BuiltFixture fixture;
  fixture.input = dir + "/m.nemo";
  // The merged model: rank 0's embedding rows, then rank 1's; the norm as rank 0 has it.
  fixture.expected = ThreeFixtureTensors(names);
  fixture.expected[0].shape = {8, 3};
  fixture.expected[0].bytes += ThreeFixtureTensors(names, 101.5f)[0].bytes;
  const size_t last = members.size() - 1;
  fixture.damages = TorchSaveDamages("m.nemo", ranks[1], "word_embeddings", tar.data_offsets[last],
                                     /*whole_file=*/false);
  fixture.damages.push_back({"m.nemo: flipped byte in the tar header of mp_rank_01's ckpt",
                             "m.nemo", FixtureDamage::Kind::kFlip, tar.header_offsets[last] + 3});
  return fixture;
}

BuiltFixture BuildNemoTorchDistFixture(const std::string& dir) {
  using namespace dcp_testing;  // NOLINT: the pickle fragments
  const std::string w = "model.decoder.final_layernorm.weight";
  const std::string rows = FixtureF32Bytes(12, 1.5f);
  std::vector<tar_testing::Member> members = {
      {"./", "", '5'},
      {"./model_config.yaml", "tensor_model_parallel_size: 2\npipeline_model_parallel_size: 1\n"},
      {"./model_weights", "", '5'},
      {"./model_weights/metadata.json",
       R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})"},
  };
  std::vector<std::pair<std::string, std::string>> storage;
  std::vector<std::string> chunks;
  std::vector<TorchSaveFile> items;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string name = absl::StrCat("__", rank, "_0.distcp");
    items.push_back(TensorItem("FloatStorage", 6, {2, 3}, rows.substr(rank * 24, 24)));
    const std::vector<int64_t> offsets = {2 * rank, 0};
    storage.push_back(
        {Index(w, &offsets, rank), Info(name, 0, static_cast<int64_t>(items.back().bytes.size()))});
    chunks.push_back(Chunk({2 * rank, 0}, {2, 3}));
    members.push_back({"./model_weights/" + name, items.back().bytes});
  }
  members.push_back(
      {"./model_weights/.metadata",
       Metadata(Dict({{Str(w), TensorMd(Properties("float32", kMd), {4, 3}, chunks)}}),
                Dict(storage))});
  const tar_testing::Built tar = tar_testing::BuildTar(members);
  WriteAll(dir + "/m.nemo", tar.bytes);
  BuiltFixture fixture;
  fixture.input = dir + "/m.nemo";
  fixture.expected = {{w, DType::kF32, {4, 3}, rows}};
  const size_t rank1 = 5;  // ./model_weights/__1_0.distcp
  fixture.damages = TorchSaveDamages("m.nemo", items[1], "FloatStorage", tar.data_offsets[rank1],
                                     /*whole_file=*/false);
  fixture.damages.push_back({"m.nemo: cut inside model_weights/__1_0.distcp", "m.nemo",
                             FixtureDamage::Kind::kTruncate, tar.data_offsets[rank1] + 10});
  fixture.damages.push_back({"m.nemo: flipped byte in the tar header of model_weights/__1_0.distcp",
                             "m.nemo", FixtureDamage::Kind::kFlip, tar.header_offsets[rank1] + 3});
  return fixture;
}

const FormatFixtureRegistration register_fixture("nemo", BuildNemoFixture);
const FormatFixtureRegistration register_torch_dist_fixture("nemo", "torch-dist",
                                                            BuildNemoTorchDistFixture);

}  // namespace
}  // namespace reshard
