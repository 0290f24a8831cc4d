// The fixture of the "fsdp1-sharded" input format (see lib/formats/format_fixture.h): an FSDP1
// SHARDED_STATE_DICT save of world size 2, model_rank{0,1}.pt, each a torch.save of
// ShardedTensors pickled as torch 2.x pickles them: embed.weight (F32 [4, 3]) in rows 2 + 2,
// ln.weight (BF16 [3]) in 2 + 1, and steps (I64 [2]) a plain buffer in both files.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/fsdp/fsdp1_fixture.h"
#include "lib/formats/fsdp/sharded_tensor_pickle_writer.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

BuiltFixture BuildFsdp1Fixture(const std::string& dir) {
  const std::vector<std::string> names = {"embed.weight", "ln.weight", "steps"};
  const std::vector<FixtureTensor> tensors = ThreeFixtureTensors(names);
  std::vector<TorchSaveFile> archives;
  std::vector<std::string> files;
  for (int64_t rank = 0; rank < 2; ++rank) {
    PickleWriter p;
    p.BeginDict(true);
    std::vector<std::pair<std::string, std::string>> storages;
    // Tensor `i` as a ShardedTensor whose local shard is storage `key` of `storage_class`.
    auto add = [&](int i, const std::string& dtype, const std::string& storage_class,
                   const std::string& key) {
      ShardedTensorToWrite st;
      st.dtype = dtype;
      st.global_shape = tensors[i].shape;
      st.shards = ChunkShards(st.global_shape, 2);
      st.rank = rank;
      st.world_size = 2;
      st.local = {static_cast<size_t>(rank)};
      const Box& box = st.shards[rank].box;
      const int64_t row_numel = box.extent.size() > 1 ? box.extent[1] : 1;  // 1-d or 2-d
      const int64_t numel = row_numel * box.extent[0];
      const int64_t row = row_numel * static_cast<int64_t>(DTypeSize(tensors[i].dtype));
      st.local_tensor = [&, numel, box](PickleWriter& w, size_t) {
        w.Tensor(storage_class, key, numel, box.extent, RowMajorStrides(box.extent));
      };
      storages.emplace_back(key, tensors[i].bytes.substr(box.origin[0] * row, box.extent[0] * row));
      p.String(names[i]);
      WriteShardedTensor(p, st);
    };
    add(0, "float32", "FloatStorage", "0");
    add(1, "bfloat16", "BFloat16Storage", "1");
    p.String(names[2]);
    p.Tensor("LongStorage", "2", 2, {2}, {1});
    storages.emplace_back("2", tensors[2].bytes);
    p.EndDict();
    archives.push_back(BuildTorchSave(p.Finish(), storages));
    files.push_back(absl::StrCat("model_rank", rank, ".pt"));
    WriteAll(dir + "/" + files.back(), archives.back().bytes);
  }
  BuiltFixture fixture = TorchSaveFolderFixture(dir, files[0], archives[0], names[0]);
  fixture.expected = tensors;
  fixture.damages.push_back(
      {absl::StrCat(files[1], ": missing"), files[1], FixtureDamage::Kind::kRemove, 0});
  return fixture;
}

const FormatFixtureRegistration register_fixture("fsdp1-sharded", BuildFsdp1Fixture);

}  // namespace

std::map<std::string, std::string> Fsdp1SaveFiles(int world) {
  const std::string w = FixtureF32Bytes(8 * int64_t{world}, 0);
  std::map<std::string, std::string> files;
  for (int rank = 0; rank < world; ++rank) {
    PickleWriter p;
    p.BeginDict(true);
    ShardedTensorToWrite st;
    st.global_shape = {world, 8};
    st.shards = ChunkShards(st.global_shape, world);
    st.rank = rank;
    st.world_size = world;
    st.local = {static_cast<size_t>(rank)};
    st.local_tensor = [](PickleWriter& writer, size_t) {
      writer.Tensor("FloatStorage", "0", 8, {1, 8}, {8, 1});
    };
    p.String("w");
    WriteShardedTensor(p, st);
    p.EndDict();
    files[absl::StrCat("model_rank", rank, ".pt")] =
        BuildTorchSave(p.Finish(), {{"0", w.substr(rank * 32, 32)}}).bytes;
  }
  return files;
}
}  // namespace reshard
