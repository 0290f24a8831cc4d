// The fixture of the "verl-fsdp" input format (see lib/formats/format_fixture.h): a verl save of
// world size 2, model_world_size_2_rank_{0,1}.pt, each a torch.save of DTensors pickled as
// torch 2.x pickles them: embed.weight (F32 [4, 3]) and steps (I64 [2]) Shard(0) by rows,
// ln.weight (BF16 [3]) Replicate() in both files.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/fsdp/dtensor_pickle_writer.h"
#include "lib/formats/fsdp/verl_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

BuiltFixture BuildVerlFixture(const std::string& dir) {
  const std::vector<std::string> names = {"embed.weight", "ln.weight", "steps"};
  const std::vector<FixtureTensor> tensors = ThreeFixtureTensors(names);
  std::vector<TorchSaveFile> archives;
  std::vector<std::string> files;
  for (int64_t rank = 0; rank < 2; ++rank) {
    PickleWriter p;
    p.BeginDict(true);
    // One DTensor whose local tensor is storage `key` of `numel` elements, of shape `local`.
    auto add = [&](int i, const std::string& dtype, const std::string& storage,
                   const std::string& key, bool shard, int64_t numel, const Shape& local) {
      DTensorToWrite d;
      d.dtype = dtype;
      d.global_shape = tensors[i].shape;
      d.placements = {DTensorPlacement{shard, 0}};
      d.device = rank;
      d.local_tensor = [&](PickleWriter& w) {
        w.Tensor(storage, key, numel, local, RowMajorStrides(local));
      };
      p.String(names[i]);
      WriteDTensor(p, d);
    };
    add(0, "float32", "FloatStorage", "0", true, 6, {2, 3});
    add(1, "bfloat16", "BFloat16Storage", "1", false, 3, {3});
    add(2, "int64", "LongStorage", "2", true, 1, {1});
    p.EndDict();
    const std::vector<std::pair<std::string, std::string>> storages = {
        {"0", tensors[0].bytes.substr(rank * 24, 24)},
        {"1", tensors[1].bytes},
        {"2", tensors[2].bytes.substr(rank * 8, 8)},
    };
    archives.push_back(BuildTorchSave(p.Finish(), storages));
    files.push_back(absl::StrCat("model_world_size_2_rank_", rank, ".pt"));
    WriteAll(dir + "/" + files.back(), archives.back().bytes);
  }
  WriteAll(dir + "/fsdp_config.json", R"({"FSDP_version": 2, "world_size": 2})");
  BuiltFixture fixture = TorchSaveFolderFixture(dir, files[0], archives[0], names[0]);
  fixture.expected = tensors;
  fixture.damages.push_back(
      {absl::StrCat(files[1], ": missing"), files[1], FixtureDamage::Kind::kRemove, 0});
  return fixture;
}

const FormatFixtureRegistration register_fixture("verl-fsdp", BuildVerlFixture);

}  // namespace

std::map<std::string, std::string> VerlSaveFiles(int world) {
  const std::string w = FixtureF32Bytes(8 * int64_t{world}, 0);
  std::map<std::string, std::string> files;
  for (int rank = 0; rank < world; ++rank) {
    PickleWriter p;
    p.BeginDict(true);
    DTensorToWrite d;
    d.global_shape = {world, 8};
    d.placements = {DTensorPlacement{true, 0}};
    d.device = rank;
    d.local_tensor = [](PickleWriter& writer) {
      writer.Tensor("FloatStorage", "0", 8, {1, 8}, {8, 1});
    };
    p.String("w");
    WriteDTensor(p, d);
    p.EndDict();
    files[absl::StrCat("model_world_size_", world, "_rank_", rank, ".pt")] =
        BuildTorchSave(p.Finish(), {{"0", w.substr(rank * 32, 32)}}).bytes;
  }
  return files;
}
}  // namespace reshard
