// The mixture-of-experts fixtures of "deepspeed-zero" beyond zero_fixture.cc's save without
// ZeRO (see lib/formats/format_fixture.h), laid out as tests/fixtures/deepspeed_moe_fixture.py
// lays out DeepSpeed's files:
//
//   "moe-zero2": an MoE model trained with ZeRO-2 on 4 data-parallel ranks at EP 2 (TP 1). The
//     model states and expert files hold 16-bit copies (other values than the fp32 weights, so
//     that only a reader taking the optimizer files gives the expected tensors); every rank's
//     bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt holds the dense group partitioned over
//     the 4 ranks and its expert group, the local experts of expert-parallel rank r % 2,
//     partitioned over the 2 ranks of its expert-data-parallel group (partition r / 2), with
//     param_slice_mappings naming the pieces and the Adam moments of both groups.
//   "moe-legacy": DeepSpeed before v0.6.0 without ZeRO, two MoE layers of two experts at EP 2:
//     expert_{g}_mp_rank_00_model_states.pt holds expert g of both layers, `num_experts` is
//     one int.
//
// Damaged variants: a rank's or an expert's file missing, a file of another save in its place,
// files cut short or with flipped bytes; each refused with one code, naming the file.

#include "lib/formats/deepspeed/moe_fixture.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/formats/deepspeed/zero_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using Kind = FixtureDamage::Kind;
using Storages = std::vector<std::pair<std::string, std::string>>;

constexpr char kTag[] = "global_step7";
constexpr char kExperts[] = "moe.deepspeed_moe.experts.deepspeed_experts.";
// DeepSpeed's NCCL_START_ALIGNMENT_FACTOR: a ZeRO-1/2 group is padded to a multiple of twice
// its partition count.
constexpr int64_t kAlignment = 2;
// What fills the padding of a partition: no tensor may hold it.
constexpr float kPadding = 4242.0f;

// "moe-zero2"'s run.
constexpr int kWorld = 4;
constexpr int kEp = 2;
constexpr int kExpertCount = 4;

// The fp32 params of "moe-zero2", in the order of their param group.
std::vector<FixtureTensor> DenseParams() {
  return {{"embed.weight", DType::kF32, {4, 3}, FixtureF32Bytes(12, 1.5f)},
          {"moe.deepspeed_moe.gate.wg.weight",
           DType::kF32,
           {kExpertCount, 3},
           FixtureF32Bytes(3 * kExpertCount, -3.0f)},
          {"ln.weight", DType::kF32, {3}, FixtureF32Bytes(3, -4.0f)}};
}

// Expert `expert`'s params under the name of expert id `id`: w.weight [2, 3] and w.bias [1]
// (7 elements, so that partitions split them).
std::vector<FixtureTensor> ExpertParams(int expert, int id) {
  const std::string prefix = absl::StrCat(kExperts, id, ".w.");
  return {{prefix + "weight", DType::kF32, {2, 3}, FixtureF32Bytes(6, 10.0f * (expert + 1))},
          {prefix + "bias", DType::kF32, {1}, FixtureF32Bytes(1, -10.0f * (expert + 1))}};
}

// The buffer the model states hold and no optimizer does.
FixtureTensor Steps() { return {"steps", DType::kI64, {2}, FixtureI64Bytes(2, 7)}; }

// `tensor`'s 16-bit copy as the model states save it: bf16 of other values than its fp32 ones.
FixtureTensor Bf16Copy(const FixtureTensor& tensor, float start) {
  return {tensor.name, DType::kBF16, tensor.shape,
          FixtureBF16Bytes(static_cast<int64_t>(tensor.bytes.size() / 4), start)};
}

// F32 `bytes` with `add` added to every value.
std::string PlusF32(const std::string& bytes, float add) {
  std::string out = bytes;
  for (size_t i = 0; i + 4 <= out.size(); i += 4) {
    float value;
    std::memcpy(&value, &out[i], 4);
    value += add;
    std::memcpy(&out[i], &value, 4);
  }
  return out;
}

// One rank's partition of a ZeRO-1/2 param group (stage_1_and_2.py): the group's params
// flattened in order and padded to a multiple of kAlignment x `count`, split in `count` equal
// partitions; this is partition `index`.
struct Partition {
  std::string fp32;  // saved without its padding
  int64_t padding = 0;
  int64_t size = 0;  // elements, padding included
  // param_slice_mappings: (name, start in the partition, numel) of each piece it holds.
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> pieces;
};

Partition PartitionOf(const std::vector<FixtureTensor>& params, int64_t count, int64_t index) {
  std::string flat;
  for (const FixtureTensor& param : params) flat += param.bytes;
  const int64_t total = static_cast<int64_t>(flat.size() / 4);
  const int64_t align = kAlignment * count;
  Partition partition;
  partition.size = (total + align - 1) / align * align / count;
  const int64_t begin = index * partition.size;
  const int64_t end = std::min(total, begin + partition.size);
  if (begin < end) partition.fp32 = flat.substr(begin * 4, (end - begin) * 4);
  partition.padding = partition.size - static_cast<int64_t>(partition.fp32.size() / 4);
  int64_t offset = 0;
  for (const FixtureTensor& param : params) {
    const int64_t numel = static_cast<int64_t>(param.bytes.size() / 4);
    const int64_t lo = std::max(offset, begin), hi = std::min(offset + numel, end);
    if (lo < hi) partition.pieces.push_back({param.name, {lo - begin, hi - lo}});
    offset += numel;
  }
  return partition;
}

// A flat F32 tensor of `bytes` padded with kPadding to `size` elements.
FixtureTensor PaddedFlat(const std::string& bytes, int64_t size) {
  std::string padded = bytes;
  while (static_cast<int64_t>(padded.size()) < size * 4) padded += FixtureF32Bytes(1, kPadding);
  return {"", DType::kF32, {size}, padded};
}

// Rank `rank`'s bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt of a run of `world` ranks
// at EP kEp: DeepSpeedZeroOptimizer.state_dict() with the dense group over every rank and the
// expert group of expert-parallel rank rank % kEp over its world / kEp ranks.
TorchSaveFile BuildOptimizerStates(int rank, int world) {
  const int ep_rank = rank % kEp;
  const int local_count = kExpertCount / kEp;
  std::vector<FixtureTensor> experts;  // under their local ids, in module order
  for (int local = 0; local < local_count; ++local) {
    for (FixtureTensor& param : ExpertParams(ep_rank * local_count + local, local)) {
      experts.push_back(std::move(param));
    }
  }
  const std::vector<int64_t> counts = {world, world / kEp};
  const std::vector<Partition> groups = {PartitionOf(DenseParams(), counts[0], rank),
                                         PartitionOf(experts, counts[1], rank / kEp)};
  Storages storages;
  PickleWriter p;
  p.BeginDict(false);
  p.String("optimizer_state_dict");
  p.BeginDict(false);
  // The flat groups first: storage "0" is read by every conversion (its CRC-32 is checked).
  p.String("single_partition_of_fp32_groups");
  p.BeginList();
  for (const Partition& group : groups) {
    WriteFixtureTensor(
        p, {"", DType::kF32, {static_cast<int64_t>(group.fp32.size() / 4)}, group.fp32}, storages);
  }
  p.EndList();
  p.String("base_optimizer_state");
  p.BeginDict(false);
  p.String("state");
  p.BeginDict(false);
  for (size_t g = 0; g < groups.size(); ++g) {
    p.Int(static_cast<int64_t>(g));
    p.BeginDict(false);
    p.String("step");
    p.Int(7);
    p.String("exp_avg");
    WriteFixtureTensor(p, PaddedFlat(PlusF32(groups[g].fp32, 100.0f), groups[g].size), storages);
    p.String("exp_avg_sq");
    WriteFixtureTensor(p, PaddedFlat(PlusF32(groups[g].fp32, 200.0f), groups[g].size), storages);
    p.EndDict();
  }
  p.EndDict();
  p.String("param_groups");
  p.BeginList();
  for (size_t g = 0; g < groups.size(); ++g) {
    p.BeginDict(false);
    p.String("lr");
    p.Float(0.001);
    p.String("params");
    p.BeginList();
    p.Int(static_cast<int64_t>(g));
    p.EndList();
    if (g == 1) {
      p.String("name");
      p.String(absl::StrCat("ep_size_", kEp));
      p.String("moe");
      p.Bool(true);
    }
    p.EndDict();
  }
  p.EndList();
  p.EndDict();
  p.String("zero_stage");
  p.Int(2);
  p.String("group_paddings");
  p.BeginList();
  for (const Partition& group : groups) p.Int(group.padding);
  p.EndList();
  p.String("partition_count");
  p.BeginList();
  for (int64_t count : counts) p.Int(count);
  p.EndList();
  p.String("param_slice_mappings");
  p.BeginList();
  for (const Partition& group : groups) {
    p.BeginDict(true);
    for (const auto& [name, piece] : group.pieces) {
      p.String(name);
      // deepspeed.utils.tensor_fragment.fragment_address(numel, start), a dataclass.
      p.Global("deepspeed.utils.tensor_fragment", "fragment_address");
      p.BeginTuple();
      p.EndTuple();
      p.NewObj();
      p.BeginDict(false);
      p.String("numel");
      p.Int(piece.second);
      p.String("start");
      p.Int(piece.first);
      p.EndDict();
      p.Build();
    }
    p.EndDict();
  }
  p.EndList();
  p.EndDict();
  p.String("ds_config");
  WriteDeepSpeedConfig(p, /*stage=*/2, /*bf16=*/true);
  p.EndDict();
  return BuildTorchSave(p.Finish(), storages);
}

// mp_rank_00_model_states.pt of an MoE save (_save_moe_checkpoint): `module` the dense
// tensors (routers included), then the run's sizes and `num_experts`, one int (`legacy`) or
// the list `layers` x `experts`.
TorchSaveFile BuildMoeModelStates(const std::vector<FixtureTensor>& module, int world, int layers,
                                  int experts, bool legacy) {
  Storages storages;
  PickleWriter p;
  p.BeginDict(false);
  p.String("module");
  WriteTensorDict(p, module, storages);
  p.String("dp_world_size");
  p.Int(world);
  p.String("mp_world_size");
  p.Int(1);
  if (legacy) {
    p.String("ds_config");
    WriteDeepSpeedConfig(p, /*stage=*/0, /*bf16=*/false);
  }
  p.String("num_experts");
  if (legacy) {
    p.Int(experts);
  } else {
    p.BeginList();
    for (int layer = 0; layer < layers; ++layer) p.Int(experts);
    p.EndList();
  }
  p.EndDict();
  return BuildTorchSave(p.Finish(), storages);
}

// expp_rank_{ep}_mp_rank_00_optim_states.pt of every expert-parallel rank: {"optimizer":
// None} (the state is in the ZeRO files, or not read).
void WriteExpertParallelOptimizers(const std::string& folder, int ep) {
  PickleWriter p;
  p.BeginDict(false);
  p.String("optimizer");
  p.None();
  p.EndDict();
  const std::string bytes = BuildTorchSave(p.Finish(), {}).bytes;
  for (int rank = 0; rank < ep; ++rank) {
    WriteAll(absl::StrCat(folder, "/expp_rank_", rank, "_mp_rank_00_optim_states.pt"), bytes);
  }
}

// `damages`, each to name the file it damages (its base name).
void NameTheFiles(std::vector<FixtureDamage>& damages) {
  for (FixtureDamage& damage : damages) {
    if (damage.named.empty()) damage.named = std::filesystem::path(damage.file).filename();
  }
}

void Append(std::vector<FixtureDamage>& to, std::vector<FixtureDamage> damages) {
  for (FixtureDamage& damage : damages) to.push_back(std::move(damage));
}

// "moe-legacy": layers.{0,1}.moe of 2 experts each, at EP 2, F32 weights in the files.
BuiltFixture BuildMoeLegacyFixture(const std::string& dir) {
  const std::string folder = absl::StrCat(dir, "/", kTag);
  std::filesystem::create_directories(folder);
  WriteAll(dir + "/latest", kTag);
  BuiltFixture fixture;
  fixture.input = dir;
  std::vector<FixtureTensor> module = {
      {"embed.weight", DType::kF32, {4, 3}, FixtureF32Bytes(12, 1.5f)}};
  for (int layer = 0; layer < 2; ++layer) {
    module.push_back({absl::StrCat("layers.", layer, ".moe.deepspeed_moe.gate.wg.weight"),
                      DType::kF32,
                      {2, 3},
                      FixtureF32Bytes(6, -2.0f - 2.0f * layer)});
  }
  const std::string dense = absl::StrCat(kTag, "/mp_rank_00_model_states.pt");
  WriteAll(dir + "/" + dense,
           BuildMoeModelStates(module, /*world=*/2, /*layers=*/2, /*experts=*/2, true).bytes);
  fixture.expected = module;
  // Expert g's file: expert g of both layers; `param` names the expert's weight.
  auto expert_file = [](int g, const std::string& param) {
    std::vector<FixtureTensor> tensors;
    for (int layer = 0; layer < 2; ++layer) {
      tensors.push_back({absl::StrCat("layers.", layer, ".", kExperts, g, ".", param),
                         DType::kF32,
                         {2, 3},
                         FixtureF32Bytes(6, 10.0f * (g + 1) + layer)});
    }
    return tensors;
  };
  TorchSaveFile expert1;
  for (int g = 0; g < 2; ++g) {
    const std::vector<FixtureTensor> tensors = expert_file(g, "w.weight");
    const TorchSaveFile archive = TorchSaveOf(tensors);
    WriteAll(absl::StrCat(folder, "/expert_", g, "_mp_rank_00_model_states.pt"), archive.bytes);
    if (g == 1) expert1 = archive;
    for (const FixtureTensor& tensor : tensors) fixture.expected.push_back(tensor);
  }
  WriteExpertParallelOptimizers(folder, 2);
  const std::string file = absl::StrCat(kTag, "/expert_1_mp_rank_00_model_states.pt");
  fixture.damages = TorchSaveDamages(file, expert1, "w.weight");
  // An expert missing from the save: an incomplete checkpoint.
  fixture.damages.push_back({file + ": missing", file, Kind::kRemove, 0, false, false, false,
                             absl::StatusCode::kDataLoss});
  // Expert 1's file of another model, whose experts hold w2.weight: two saves mixed.
  FixtureDamage mixed{file + ": of another save", file, Kind::kReplace, 0, false, false, false,
                      absl::StatusCode::kDataLoss};
  mixed.replacement = TorchSaveOf(expert_file(1, "w2.weight")).bytes;
  fixture.damages.push_back(std::move(mixed));
  NameTheFiles(fixture.damages);
  // Expert files alone are no DeepSpeed save: nothing left identifies the format.
  fixture.damages.push_back({dense + ": missing", dense, Kind::kRemove, 0, false, false, false,
                             absl::StatusCode::kInvalidArgument});
  return fixture;
}

BuiltFixture BuildMoeZeroFixture(const std::string& dir) {
  return WriteMoeZeroFolder(dir, /*moments=*/false);
}

const FormatFixtureRegistration register_moe_zero2("deepspeed-zero", "moe-zero2",
                                                   BuildMoeZeroFixture);
const FormatFixtureRegistration register_moe_legacy("deepspeed-zero", "moe-legacy",
                                                    BuildMoeLegacyFixture);

}  // namespace

BuiltFixture WriteMoeZeroFolder(const std::string& dir, bool moments) {
  const std::string folder = absl::StrCat(dir, "/", kTag);
  std::filesystem::create_directories(folder);
  WriteAll(dir + "/latest", kTag);
  BuiltFixture fixture;
  fixture.input = dir;
  fixture.expected.push_back(Steps());
  // The model states: the buffer and the dense params' 16-bit copies.
  std::vector<FixtureTensor> module = {Steps()};
  for (const FixtureTensor& param : DenseParams()) {
    module.push_back(Bf16Copy(param, -50.0f));
    fixture.expected.push_back(param);
  }
  WriteAll(absl::StrCat(folder, "/mp_rank_00_model_states.pt"),
           BuildMoeModelStates(module, kWorld, /*layers=*/1, kExpertCount, false).bytes);
  // layer_0_expert_{g}: expert g's 16-bit copies under its global id.
  std::vector<TorchSaveFile> expert_files;
  for (int g = 0; g < kExpertCount; ++g) {
    std::vector<FixtureTensor> copies;
    for (FixtureTensor& param : ExpertParams(g, g)) {
      copies.push_back(Bf16Copy(param, -60.0f));
      fixture.expected.push_back(std::move(param));
    }
    expert_files.push_back(TorchSaveOf(copies));
    WriteAll(absl::StrCat(folder, "/layer_0_expert_", g, "_mp_rank_00_model_states.pt"),
             expert_files.back().bytes);
  }
  WriteExpertParallelOptimizers(folder, kEp);
  std::vector<TorchSaveFile> optimizers;
  for (int rank = 0; rank < kWorld; ++rank) {
    optimizers.push_back(BuildOptimizerStates(rank, kWorld));
    WriteAll(absl::StrCat(folder, "/bf16_zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt"),
             optimizers.back().bytes);
  }
  if (moments) {
    const size_t params = fixture.expected.size();
    for (size_t i = 1; i < params; ++i) {               // after the buffer
      const FixtureTensor param = fixture.expected[i];  // a copy: push_back reallocates
      fixture.expected.push_back(
          {param.name + ".exp_avg", DType::kF32, param.shape, PlusF32(param.bytes, 100.0f)});
      fixture.expected.push_back(
          {param.name + ".exp_avg_sq", DType::kF32, param.shape, PlusF32(param.bytes, 200.0f)});
    }
  }
  auto optimizer = [](int rank) {
    return absl::StrCat(kTag, "/bf16_zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt");
  };
  fixture.damages = TorchSaveDamages(optimizer(1), optimizers[1], "partition_count");
  // A rank's optimizer file missing: an incomplete checkpoint.
  fixture.damages.push_back({optimizer(2) + ": missing", optimizer(2), Kind::kRemove, 0, false,
                             false, false, absl::StatusCode::kDataLoss});
  // Rank 3's file of a run of 8 ranks: two saves mixed.
  FixtureDamage mixed{
      optimizer(3) + ": of another save", optimizer(3), Kind::kReplace, 0, false, false, false,
      absl::StatusCode::kDataLoss};
  mixed.replacement = BuildOptimizerStates(3, 2 * kWorld).bytes;
  fixture.damages.push_back(std::move(mixed));
  const std::string expert3 = absl::StrCat(kTag, "/layer_0_expert_3_mp_rank_00_model_states.pt");
  fixture.damages.push_back({expert3 + ": missing", expert3, Kind::kRemove, 0, false, false, false,
                             absl::StatusCode::kDataLoss});
  fixture.damages.push_back({expert3 + ": truncated inside data.pkl", expert3, Kind::kTruncate,
                             expert_files[3].pickle + expert_files[3].pickle_size / 2});
  NameTheFiles(fixture.damages);
  return fixture;
}

}  // namespace reshard
