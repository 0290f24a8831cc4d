// The fixture of the "megatron" input format (see lib/formats/format_fixture.h): a Megatron-LM
// save folder, latest_checkpointed_iteration.txt naming iteration 1, two TP ranks and one PP
// rank (iter_0000001/mp_rank_0{0,1}/model_optim_rng.pt) whose `model` holds the weights; the
// engine merges the two parts with the reader's default rules.

#include "lib/formats/megatron/megatron_fixture.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {

void WriteMegatronVersionAndIteration(PickleWriter& p) {
  p.String("checkpoint_version");
  p.Float(3.0);
  p.String("iteration");
  p.Int(1);
  p.EndDict();
}

namespace {

BuiltFixture BuildMegatronFixture(const std::string& dir) {
  // Names the `megatron` partition rules know (there is no catch-all rule): the word embeddings
  // split by rows over the TP ranks, the final norm replicated.
  const std::vector<std::string> names = {"language_model.embedding.word_embeddings.weight",
                                          "language_model.encoder.final_layernorm.weight",
                                          "language_model.encoder.final_layernorm.bias"};
  PickleWriter p;
  p.BeginDict(false);
  p.String("model");
  WriteFixtureStateDict(p, names);
  WriteMegatronVersionAndIteration(p);
  const std::string pickle = p.Finish();
  WriteAll(dir + "/latest_checkpointed_iteration.txt", "1");
  std::vector<std::string> files;
  std::vector<TorchSaveFile> archives;
  for (int rank = 0; rank < 2; ++rank) {
    // Each rank holds its own rows of the embeddings.
    archives.push_back(BuildTorchSave(pickle, FixtureStateDictStorages(1.5f + 100.0f * rank)));
    const std::string folder = absl::StrCat("iter_0000001/mp_rank_0", rank);
    std::filesystem::create_directories(dir + "/" + folder);
    files.push_back(folder + "/model_optim_rng.pt");
    WriteAll(dir + "/" + files.back(), archives.back().bytes);
  }
  BuiltFixture fixture = TorchSaveFolderFixture(dir, files[0], archives[0], "word_embeddings");
  // The merged model: rank 0's embedding rows, then rank 1's; the norm as every rank has it.
  fixture.expected = ThreeFixtureTensors(names);
  fixture.expected[0].shape = {8, 3};
  fixture.expected[0].bytes += ThreeFixtureTensors(names, 101.5f)[0].bytes;
  fixture.damages.push_back({files[1] + ": missing", files[1], FixtureDamage::Kind::kRemove, 0});
  // A rank's file missing from the save: an incomplete checkpoint.
  for (FixtureDamage& damage : fixture.damages) {
    if (damage.kind == FixtureDamage::Kind::kRemove) damage.code = absl::StatusCode::kDataLoss;
  }
  return fixture;
}

const FormatFixtureRegistration register_fixture("megatron", BuildMegatronFixture);

}  // namespace
}  // namespace reshard
