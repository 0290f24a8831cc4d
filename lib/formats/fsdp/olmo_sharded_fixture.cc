// The fixture of the "olmo-sharded" input format (see lib/formats/format_fixture.h): an OLMo
// LocalShardedCheckpointer save of world size 2, model/rank{0,1}.pt, one FSDP module with a flat
// parameter per fixture tensor (one dtype each) cut as FSDP cuts it: embed.weight (F32, 12
// elements) 6 and 6, ln.weight (BF16, 3) 2 and 1 + 1 padding element, steps (I64, 2) 1 and 1;
// torch 2.1's _shard_param_infos.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/fsdp/olmo_sharded_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

// One handle: a flat parameter of one parameter `name` of `shape`, the rank holding elements
// [first, first + numel) of it, padded with `padding` zeros.
void WriteHandle(PickleWriter& p, const std::string& name, const Shape& shape,
                 const std::string& storage_class, const std::string& key, int64_t first,
                 int64_t numel, int64_t padding) {
  p.BeginDict(false);
  p.String("flat_param.data");
  p.Tensor(storage_class, key, numel + padding, {numel + padding}, {1});
  p.String("flat_param._fqns");
  p.BeginTuple();
  p.String(name);
  p.EndTuple();
  p.String("flat_param._shapes");
  p.BeginTuple();
  p.Global("torch", "Size");
  p.BeginTuple();
  p.BeginTuple();
  for (int64_t extent : shape) p.Int(extent);
  p.EndTuple();
  p.EndTuple();
  p.Reduce();
  p.EndTuple();
  p.String("flat_param._shard_param_infos");
  p.BeginTuple();
  p.Global("torch.distributed.fsdp._flat_param", "_ShardParamInfo");
  p.BeginTuple();
  p.Bool(true);
  p.Int(0);
  p.Int(numel);
  p.Int(first);
  p.Int(first + numel - 1);
  p.EndTuple();
  p.NewObj();
  p.EndTuple();
  p.String("flat_param._shard_numel_padded");
  p.Int(padding);
  p.EndDict();
}

// A model file's state: one FSDP module (named "", as the root module) whose handles
// `handles` writes.
std::string OlmoModelPickle(const std::function<void(PickleWriter&)>& handles) {
  PickleWriter p;
  p.BeginDict(false);
  p.String("modules");
  p.BeginList();
  p.BeginDict(false);
  p.String("handles");
  p.BeginList();
  handles(p);
  p.EndList();
  p.String("name");
  p.String("");
  p.EndDict();
  p.EndList();
  p.EndDict();
  return p.Finish();
}

BuiltFixture BuildOlmoShardedFixture(const std::string& dir) {
  const std::vector<std::string> names = {"embed.weight", "ln.weight", "steps"};
  const std::vector<FixtureTensor> tensors = ThreeFixtureTensors(names);
  std::vector<TorchSaveFile> archives;
  std::filesystem::create_directories(dir + "/model");
  for (int64_t rank = 0; rank < 2; ++rank) {
    const std::string pickle = OlmoModelPickle([&](PickleWriter& p) {
      WriteHandle(p, names[0], tensors[0].shape, "FloatStorage", "0", rank * 6, 6, 0);
      WriteHandle(p, names[1], tensors[1].shape, "BFloat16Storage", "1", rank * 2, 2 - rank,
                  rank);
      WriteHandle(p, names[2], tensors[2].shape, "LongStorage", "2", rank, 1, 0);
    });
    std::string ln = tensors[1].bytes.substr(rank * 4, 4 - 2 * rank);
    ln.resize(4, '\0');
    const std::vector<std::pair<std::string, std::string>> storages = {
        {"0", tensors[0].bytes.substr(rank * 24, 24)},
        {"1", ln},
        {"2", tensors[2].bytes.substr(rank * 8, 8)},
    };
    archives.push_back(BuildTorchSave(pickle, storages));
    WriteAll(absl::StrCat(dir, "/model/rank", rank, ".pt"), archives.back().bytes);
  }
  WriteAll(dir + "/metadata.yaml", "world_size: 2\n");
  BuiltFixture fixture = TorchSaveFolderFixture(dir, "model/rank0.pt", archives[0], names[0]);
  fixture.expected = tensors;
  fixture.damages.push_back({"model/rank1.pt: missing", "model/rank1.pt",
                             FixtureDamage::Kind::kRemove, 0});
  return fixture;
}

const FormatFixtureRegistration register_fixture("olmo-sharded", BuildOlmoShardedFixture);

}  // namespace

std::map<std::string, std::string> OlmoShardedSaveFiles(int world) {
  const std::string w = FixtureF32Bytes(8 * int64_t{world}, 0);
  std::map<std::string, std::string> files;
  files["metadata.yaml"] = absl::StrCat("world_size: ", world, "\n");
  for (int rank = 0; rank < world; ++rank) {
    const std::string pickle = OlmoModelPickle([&](PickleWriter& p) {
      WriteHandle(p, "w", {world, 8}, "FloatStorage", "0", int64_t{rank} * 8, 8, 0);
    });
    files[absl::StrCat("model/rank", rank, ".pt")] =
        BuildTorchSave(pickle, {{"0", w.substr(rank * 32, 32)}}).bytes;
  }
  return files;
}
}  // namespace reshard
