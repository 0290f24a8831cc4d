// The fixture of the "megatron" input format (see lib/formats/format_fixture.h): a Megatron-LM
// save folder, latest_checkpointed_iteration.txt naming iteration 1, one TP and PP rank
// (iter_0000001/mp_rank_00/model_optim_rng.pt) whose `model` holds the weights.

#include <filesystem>
#include <string>
#include <vector>

#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

BuiltFixture BuildMegatronFixture(const std::string& dir) {
  // Names the `megatron` partition rules know (there is no catch-all rule).
  const std::vector<std::string> names = {"language_model.embedding.word_embeddings.weight",
                                          "language_model.encoder.final_layernorm.weight",
                                          "language_model.encoder.final_layernorm.bias"};
  PickleWriter p;
  p.BeginDict(false);
  p.String("model");
  WriteFixtureStateDict(p, names);
  p.String("checkpoint_version");
  p.Float(3.0);
  p.String("iteration");
  p.Int(1);
  p.EndDict();
  const TorchSaveFile archive = BuildTorchSave(p.Finish(), FixtureStateDictStorages());
  std::filesystem::create_directories(dir + "/iter_0000001/mp_rank_00");
  WriteAll(dir + "/latest_checkpointed_iteration.txt", "1");
  const std::string file = "iter_0000001/mp_rank_00/model_optim_rng.pt";
  WriteAll(dir + "/" + file, archive.bytes);
  return TorchSaveFolderFixture(dir, file, archive, "word_embeddings");
}

const FormatFixtureRegistration register_fixture("megatron", BuildMegatronFixture);

}  // namespace
}  // namespace reshard
