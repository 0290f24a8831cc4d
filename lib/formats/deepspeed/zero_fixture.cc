// The fixtures of the "deepspeed-zero" input format (see lib/formats/format_fixture.h): a
// DeepSpeed save folder without ZeRO partitioning, whose mp_rank_00_model_states.pt holds the
// weights in its `module` (engine._save_checkpoint), one of them tied; a mixture-of-experts
// save without ZeRO (engine._save_moe_checkpoint); and ZeRO-2 and ZeRO-3 save folders of two
// ranks.

#include "lib/formats/deepspeed/zero_fixture.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {

namespace {

// The model-states entries after `module`: buffer_names ["steps"], optimizer None, and the key
// param_shapes (its value comes next).
void WriteBookkeepingUpToParamShapes(PickleWriter& p) {
  p.String("buffer_names");
  p.BeginList();
  p.String("steps");
  p.EndList();
  p.String("optimizer");
  p.None();
  p.String("param_shapes");
}

// A model-states dict up to its `module`'s first entry, the buffer steps [2] I64 (storage
// "0"); the module's other entries come next.
void WriteModuleUpToSteps(PickleWriter& p) {
  p.BeginDict(false);
  p.String("module");
  p.BeginDict(true);
  p.String("steps");
  p.Tensor("LongStorage", "0", 2, {2}, {1});
}

// The model-states entries mp_world_size 1 and ds_config {"zero_optimization": {"stage":
// `stage`}}.
void WriteOneRankZeroConfig(PickleWriter& p, int stage) {
  p.String("mp_world_size");
  p.Int(1);
  p.String("ds_config");
  WriteDeepSpeedConfig(p, stage, /*bf16=*/false);
}

}  // namespace

void WriteDeepSpeedConfig(PickleWriter& p, int stage, bool bf16) {
  p.BeginDict(false);
  if (stage >= 0) {
    p.String("zero_optimization");
    p.BeginDict(false);
    p.String("stage");
    p.Int(stage);
    p.EndDict();
  }
  if (bf16) {
    p.String("bf16");
    p.BeginDict(false);
    p.String("enabled");
    p.Bool(true);
    p.EndDict();
  }
  p.EndDict();
}

TorchSaveFile WriteModelStates(const std::string& path, const ModelStates& states) {
  PickleWriter p;
  p.BeginDict(false);
  p.String("module");
  if (states.module_none) {
    p.None();
  } else {
    p.BeginDict(true);
    p.String("embed.weight");
    p.Tensor("FloatStorage", "0", states.rows * 3, {states.rows, 3}, {3, 1});
    p.String("lm_head.weight");
    p.Tensor("FloatStorage", "0", states.rows * 3, {states.rows, 3}, {3, 1});
    p.String("ln.bias");
    p.Tensor("HalfStorage", "1", 3, {3}, {1});
    p.String("steps");
    p.Tensor("LongStorage", "2", 1, {}, {});
    p.String("layer._extra_state");
    p.None();
    p.EndDict();
  }
  WriteBookkeepingUpToParamShapes(p);
  if (states.param_shapes) {
    p.BeginList();
    p.BeginDict(true);
    p.EndDict();
    p.EndList();
  } else {
    p.None();
  }
  if (states.mp_world_size >= 0) {
    p.String("mp_world_size");
    p.Int(states.mp_world_size);
  }
  p.String("ds_config");
  WriteDeepSpeedConfig(p, states.zero_stage, states.bf16);
  p.EndDict();
  TorchSaveFile archive = BuildTorchSave(p.Finish(), {{"0", std::string(states.rows * 3 * 4, '\1')},
                                                      {"1", std::string(3 * 2, '\2')},
                                                      {"2", std::string(8, '\3')}});
  WriteAll(path, archive.bytes);
  return archive;
}

namespace {

// DeepSpeed without ZeRO: the weights are the `module` of mp_rank_00_model_states.pt.
BuiltFixture BuildNoZeroFixture(const std::string& dir) {
  std::filesystem::create_directories(dir + "/global_step3");
  WriteAll(dir + "/latest", "global_step3");
  const std::string file = "global_step3/mp_rank_00_model_states.pt";
  const TorchSaveFile archive = WriteModelStates(dir + "/" + file, ModelStates{});
  BuiltFixture fixture = TorchSaveFolderFixture(dir, file, archive, "embed.weight");
  // WriteModelStates' module; lm_head.weight is tied to embed.weight.
  const std::string embed(4 * 3 * 4, '\1');
  fixture.expected = {{"embed.weight", DType::kF32, {4, 3}, embed},
                      {"lm_head.weight", DType::kF32, {4, 3}, embed},
                      {"ln.bias", DType::kF16, {3}, std::string(3 * 2, '\2')},
                      {"steps", DType::kI64, {}, std::string(8, '\3')}};
  // Without its only file the folder holds no checkpoint of any format.
  ExpectDamageCode(fixture, file + ": missing", absl::StatusCode::kInvalidArgument);
  return fixture;
}

// Model states of a ZeRO run whose trainable params are embed.weight [4, 3] and ln.weight [3]
// (param_shapes, one group) and whose buffer `steps` [2] I64 is in `module` (storage "0"); for
// ZeRO-1/2 the module also holds 16-bit views of the params, which are not read.
TorchSaveFile WriteZeroModelStates(const std::string& path, int stage, const std::string& steps) {
  PickleWriter p;
  WriteModuleUpToSteps(p);
  std::vector<std::pair<std::string, std::string>> storages = {{"0", steps}};
  if (stage < 3) {
    p.String("embed.weight");
    p.Tensor("BFloat16Storage", "1", 15, {4, 3}, {3, 1});
    p.String("ln.weight");
    p.Tensor("BFloat16Storage", "1", 15, {3}, {1});  // a view at offset 0: never read
    storages.emplace_back("1", std::string(15 * 2, '\0'));
  }
  p.EndDict();
  WriteBookkeepingUpToParamShapes(p);
  p.BeginList();
  p.BeginDict(true);
  p.String("embed.weight");
  p.BeginTuple();
  p.Int(4);
  p.Int(3);
  p.EndTuple();
  p.String("ln.weight");
  p.BeginTuple();
  p.Int(3);
  p.EndTuple();
  p.EndDict();
  p.EndList();
  WriteOneRankZeroConfig(p, stage);
  p.EndDict();
  TorchSaveFile archive = BuildTorchSave(p.Finish(), storages);
  WriteAll(path, archive.bytes);
  return archive;
}

// One rank's optimizer states of a ZeRO run over two ranks with one flat fp32 group: `flat`
// (single_partition_of_fp32_groups for ZeRO-1/2, with group_paddings; fp32_flat_groups for
// ZeRO-3). With `moments` (ZeRO-1/2 only), base_optimizer_state also holds the group's Adam
// state at step 5: exp_avg and exp_avg_sq are `flat` plus 100 and 200.
// With `world`, the run has that many ranks (partition_count).
TorchSaveFile BuildZeroOptimizerStates(int stage, const std::string& flat, int64_t padding,
                                       bool moments, int world) {
  const int64_t numel = static_cast<int64_t>(flat.size() / 4);
  std::vector<std::pair<std::string, std::string>> storages = {{"0", flat}};
  PickleWriter p;
  p.BeginDict(false);
  p.String("optimizer_state_dict");
  p.BeginDict(false);
  if (moments) {
    std::string exp_avg = flat, exp_avg_sq = flat;
    for (int64_t i = 0; i < numel; ++i) {
      float value;
      std::memcpy(&value, flat.data() + i * 4, 4);
      const float avg = value + 100.0f, avg_sq = value + 200.0f;
      std::memcpy(&exp_avg[i * 4], &avg, 4);
      std::memcpy(&exp_avg_sq[i * 4], &avg_sq, 4);
    }
    storages.emplace_back("1", exp_avg);
    storages.emplace_back("2", exp_avg_sq);
    p.String("base_optimizer_state");
    p.BeginDict(false);
    p.String("state");
    p.BeginDict(false);
    p.Int(0);
    p.BeginDict(false);
    p.String("step");
    p.Int(5);
    p.String("exp_avg");
    p.Tensor("FloatStorage", "1", numel, {numel}, {1});
    p.String("exp_avg_sq");
    p.Tensor("FloatStorage", "2", numel, {numel}, {1});
    p.EndDict();
    p.EndDict();
    p.String("param_groups");
    p.BeginList();
    p.BeginDict(false);
    p.String("lr");
    p.Float(0.001);
    p.String("params");
    p.BeginList();
    p.Int(0);
    p.EndList();
    p.EndDict();
    p.EndList();
    p.EndDict();
  }
  p.String("zero_stage");
  p.Int(stage);
  p.String("partition_count");
  if (stage == 3) {
    p.Int(world);
  } else {
    p.BeginList();
    p.Int(world);
    p.EndList();
  }
  p.String(stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups");
  p.BeginList();
  p.Tensor("FloatStorage", "0", numel, {numel}, {1});
  p.EndList();
  if (stage < 3) {
    p.String("group_paddings");
    p.BeginList();
    p.Int(padding);
    p.EndList();
  }
  p.EndDict();
  p.EndDict();
  return BuildTorchSave(p.Finish(), storages);
}

TorchSaveFile WriteZeroOptimizerStates(const std::string& path, int stage, const std::string& flat,
                                       int64_t padding, bool moments = false) {
  TorchSaveFile archive = BuildZeroOptimizerStates(stage, flat, padding, moments, /*world=*/2);
  WriteAll(path, archive.bytes);
  return archive;
}

// A ZeRO save folder of two ranks holding embed.weight [4, 3] and ln.weight [3] (fp32, from the
// optimizer files) and the buffer steps [2] (from the model states); `flats` are the ranks'
// flat groups and `paddings` their group_paddings (ZeRO-1/2).
BuiltFixture WriteZeroFolder(const std::string& dir, int stage,
                             const std::vector<std::string>& flats,
                             const std::vector<int64_t>& paddings, bool moments = false) {
  const std::string tag = "global_step5";
  std::filesystem::create_directories(dir + "/" + tag);
  WriteAll(dir + "/latest", tag);
  const std::string steps = FixtureI64Bytes(2, 7);
  std::vector<std::string> models;
  std::vector<TorchSaveFile> model_archives;
  for (int rank = 0; rank < (stage == 3 ? 2 : 1); ++rank) {
    models.push_back(stage == 3
                         ? absl::StrCat(tag, "/zero_pp_rank_", rank, "_mp_rank_00_model_states.pt")
                         : tag + "/mp_rank_00_model_states.pt");
    model_archives.push_back(WriteZeroModelStates(dir + "/" + models.back(), stage, steps));
  }
  std::vector<std::string> optims;
  std::vector<TorchSaveFile> optim_archives;
  for (int rank = 0; rank < 2; ++rank) {
    optims.push_back(absl::StrCat(tag, "/zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt"));
    optim_archives.push_back(WriteZeroOptimizerStates(dir + "/" + optims.back(), stage, flats[rank],
                                                      paddings[rank], moments));
  }
  BuiltFixture fixture =
      TorchSaveFolderFixture(dir, optims[1], optim_archives[1], "partition_count");
  for (FixtureDamage& damage : TorchSaveDamages(models[0], model_archives[0], "buffer_names")) {
    fixture.damages.push_back(std::move(damage));
  }
  for (const std::string& model : models) {
    fixture.damages.push_back({model + ": missing", model, FixtureDamage::Kind::kRemove, 0});
  }
  // A rank's file missing from the save: an incomplete checkpoint.
  for (FixtureDamage& damage : fixture.damages) {
    if (damage.kind == FixtureDamage::Kind::kRemove) damage.code = absl::StatusCode::kDataLoss;
  }
  fixture.expected = {{"steps", DType::kI64, {2}, steps},
                      {"embed.weight", DType::kF32, {4, 3}, FixtureF32Bytes(12, 1.5f)},
                      {"ln.weight", DType::kF32, {3}, FixtureF32Bytes(3, -4.0f)}};
  return fixture;
}

// ZeRO-2 (stage_1_and_2.py's state_dict): the one param group's 15 elements, aligned to
// 2 x 2 = 16, in partitions of 8: rank 0 holds embed.weight[0:8], rank 1 embed.weight[8:12] and
// ln.weight (7 elements and 1 of padding, saved without it).
BuiltFixture WriteZero2Folder(const std::string& dir, bool moments) {
  const std::string flat = FixtureF32Bytes(12, 1.5f) + FixtureF32Bytes(3, -4.0f);
  return WriteZeroFolder(dir, 2, {flat.substr(0, 8 * 4), flat.substr(8 * 4)}, {0, 1}, moments);
}

BuiltFixture BuildZero2Fixture(const std::string& dir) { return WriteZero2Folder(dir, false); }

// ZeRO-3 (stage3.py): every param split on its own, ceil(n / 2) elements per rank: rank 0 holds
// embed.weight[0:6] and ln.weight[0:2], rank 1 embed.weight[6:12], ln.weight[2:3] and one
// element of padding (a value that must not leak into any tensor).
BuiltFixture BuildZero3Fixture(const std::string& dir) {
  const std::string embed = FixtureF32Bytes(12, 1.5f);
  const std::string ln = FixtureF32Bytes(3, -4.0f);
  const std::string padding = FixtureF32Bytes(1, 4242.0f);
  return WriteZeroFolder(dir, 3,
                         {embed.substr(0, 6 * 4) + ln.substr(0, 2 * 4),
                          embed.substr(6 * 4) + ln.substr(2 * 4) + padding},
                         {0, 0});
}

// A mixture-of-experts save without ZeRO (engine._save_moe_checkpoint), one MoE layer of two
// experts at EP 1: mp_rank_00_model_states.pt holds embed.weight [4, 3] and the router
// moe.deepspeed_moe.gate.wg.weight [2, 3] in `module` and num_experts [2];
// layer_0_expert_{0,1}_mp_rank_00_model_states.pt each hold their expert's
// moe.deepspeed_moe.experts.deepspeed_experts.{g}.w.weight [2, 3]; expp_rank_0's optimizer file
// is named but not read.
BuiltFixture BuildMoeFixture(const std::string& dir) {
  std::filesystem::create_directories(dir + "/global_step3");
  WriteAll(dir + "/latest", "global_step3");
  const std::string embed = FixtureF32Bytes(12, 1.5f);
  const std::string router = FixtureF32Bytes(6, -2.0f);
  const std::string dense = "global_step3/mp_rank_00_model_states.pt";
  PickleWriter p;
  p.BeginDict(false);
  p.String("module");
  p.BeginDict(true);
  p.String("embed.weight");
  p.Tensor("FloatStorage", "0", 12, {4, 3}, {3, 1});
  p.String("moe.deepspeed_moe.gate.wg.weight");
  p.Tensor("FloatStorage", "1", 6, {2, 3}, {3, 1});
  p.EndDict();
  WriteBookkeepingUpToParamShapes(p);
  p.None();
  WriteOneRankZeroConfig(p, 0);
  p.String("num_experts");
  p.BeginList();
  p.Int(2);
  p.EndList();
  p.EndDict();
  const TorchSaveFile dense_archive = BuildTorchSave(p.Finish(), {{"0", embed}, {"1", router}});
  WriteAll(dir + "/" + dense, dense_archive.bytes);
  BuiltFixture fixture = TorchSaveFolderFixture(dir, dense, dense_archive, "embed.weight");
  // Expert files alone are no DeepSpeed save: nothing left identifies the format.
  ExpectDamageCode(fixture, dense + ": missing", absl::StatusCode::kInvalidArgument);
  fixture.expected = {{"embed.weight", DType::kF32, {4, 3}, embed},
                      {"moe.deepspeed_moe.gate.wg.weight", DType::kF32, {2, 3}, router}};
  for (int g = 0; g < 2; ++g) {
    const std::string name =
        absl::StrCat("moe.deepspeed_moe.experts.deepspeed_experts.", g, ".w.weight");
    const std::string bytes = FixtureF32Bytes(6, 10.0f * (g + 1));
    PickleWriter expert;
    expert.BeginDict(true);
    expert.String(name);
    expert.Tensor("FloatStorage", "0", 6, {2, 3}, {3, 1});
    expert.EndDict();
    const TorchSaveFile archive = BuildTorchSave(expert.Finish(), {{"0", bytes}});
    const std::string file =
        absl::StrCat("global_step3/layer_0_expert_", g, "_mp_rank_00_model_states.pt");
    WriteAll(dir + "/" + file, archive.bytes);
    fixture.expected.push_back({name, DType::kF32, {2, 3}, bytes});
    if (g == 1) {
      for (FixtureDamage& damage : TorchSaveDamages(file, archive, name)) {
        fixture.damages.push_back(std::move(damage));
      }
      // An expert missing from the save: an incomplete checkpoint.
      fixture.damages.push_back({file + ": missing", file, FixtureDamage::Kind::kRemove, 0, false,
                                 false, false, absl::StatusCode::kDataLoss});
    }
  }
  PickleWriter optimizer;
  optimizer.BeginDict(false);
  optimizer.String("optimizer");
  optimizer.None();
  optimizer.EndDict();
  WriteAll(dir + "/global_step3/expp_rank_0_mp_rank_00_optim_states.pt",
           BuildTorchSave(optimizer.Finish(), {}).bytes);
  return fixture;
}

const FormatFixtureRegistration register_no_zero("deepspeed-zero", "no-zero", BuildNoZeroFixture);
const FormatFixtureRegistration register_moe("deepspeed-zero", "moe", BuildMoeFixture);
const FormatFixtureRegistration register_zero2("deepspeed-zero", "zero2", BuildZero2Fixture);
const FormatFixtureRegistration register_zero3("deepspeed-zero", "zero3", BuildZero3Fixture);

}  // namespace

std::string WriteZeroFolderWithMoments(const std::string& dir) {
  return WriteZero2Folder(dir, /*moments=*/true).input;
}

namespace {

// Model states of ZeroSaveFiles' run: module {steps}, buffer_names ["steps"], param_shapes
// [{"w": (world, 8)}]; ZeRO-3 adds the frozen param "f" (world, 2), whose 2-element fragment
// `fragment` (storage "1") is this rank's.
TorchSaveFile BuildRankModelStates(int stage, int world, const std::string& steps,
                                   const std::string& fragment) {
  PickleWriter p;
  WriteModuleUpToSteps(p);
  p.EndDict();
  WriteBookkeepingUpToParamShapes(p);
  p.BeginList();
  p.BeginDict(true);
  p.String("w");
  p.BeginTuple();
  p.Int(world);
  p.Int(8);
  p.EndTuple();
  p.EndDict();
  p.EndList();
  std::vector<std::pair<std::string, std::string>> storages = {{"0", steps}};
  if (stage == 3) {
    p.String("frozen_param_shapes");
    p.BeginDict(true);
    p.String("f");
    p.BeginTuple();
    p.Int(world);
    p.Int(2);
    p.EndTuple();
    p.EndDict();
    p.String("frozen_param_fragments");
    p.BeginDict(true);
    p.String("f");
    p.Tensor("FloatStorage", "1", 2, {2}, {1});
    p.EndDict();
    storages.emplace_back("1", fragment);
  }
  p.String("mp_world_size");
  p.Int(1);
  p.EndDict();
  return BuildTorchSave(p.Finish(), storages);
}

}  // namespace

std::map<std::string, std::string> ZeroSaveFiles(int stage, int world) {
  const std::string tag = "global_step5";
  std::map<std::string, std::string> files;
  files["latest"] = tag;
  const std::string steps = FixtureI64Bytes(2, 7);
  for (int rank = 0; rank < world; ++rank) {
    const std::string flat = FixtureF32Bytes(8, 2.0f * rank);
    files[absl::StrCat(tag, "/zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt")] =
        BuildZeroOptimizerStates(stage, flat, /*padding=*/0, /*moments=*/false, world).bytes;
    if (stage == 3 || rank == 0) {
      const std::string model = stage == 3 ? absl::StrCat(tag, "/zero_pp_rank_", rank,
                                                          "_mp_rank_00_model_states.pt")
                                           : tag + "/mp_rank_00_model_states.pt";
      files[model] =
          BuildRankModelStates(stage, world, steps, FixtureF32Bytes(2, 0.5f * rank)).bytes;
    }
  }
  return files;
}

}  // namespace reshard
