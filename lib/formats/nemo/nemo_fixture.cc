// The fixture of the "nemo" input format (see lib/formats/format_fixture.h): a NeMo 1 archive
// m.nemo (members prefixed "./", as NeMo's tarfile writes them) holding model_config.yaml
// (TP 2, PP 1), a tokenizer file with NeMo's hash prefix, and mp_rank_0{0,1}/model_weights.ckpt,
// each a state dict under Megatron-LM names with NeMo's `model.` prefix; the engine merges the two
// parts with the reader's default rules. Damages: the torch.save damages inside rank 1's member
// (offsets in the archive), and a flipped byte in that member's tar header.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

const FormatFixtureRegistration register_fixture("nemo", BuildNemoFixture);

}  // namespace
}  // namespace reshard
