// The fixtures of the "deepspeed-zero" input format (see lib/formats/format_fixture.h): a
// DeepSpeed save folder without ZeRO partitioning, whose mp_rank_00_model_states.pt holds the
// weights in its `module` (engine._save_checkpoint), one of them tied; and a ZeRO-2 save folder
// of two ranks.

#include "lib/formats/deepspeed/zero_fixture.h"

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {

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
  p.String("buffer_names");
  p.BeginList();
  p.String("steps");
  p.EndList();
  p.String("optimizer");
  p.None();
  p.String("param_shapes");
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
  p.BeginDict(false);
  if (states.zero_stage >= 0) {
    p.String("zero_optimization");
    p.BeginDict(false);
    p.String("stage");
    p.Int(states.zero_stage);
    p.EndDict();
  }
  if (states.bf16) {
    p.String("bf16");
    p.BeginDict(false);
    p.String("enabled");
    p.Bool(true);
    p.EndDict();
  }
  p.EndDict();
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
  return fixture;
}

// ZeRO-2 over two ranks (stage_1_and_2.py's state_dict): one param group of embed.weight [4, 3]
// and ln.weight [3], 15 elements, aligned to 2 x 2 = 16, partitions of 8: rank 0 holds
// embed.weight[0:8], rank 1 embed.weight[8:12] and ln.weight (7 elements, 1 of padding, saved
// without it). The fp32 weights come from the optimizer files; the buffer `steps` from the
// module of mp_rank_00_model_states.pt, whose 16-bit params are not read.
BuiltFixture BuildZero2Fixture(const std::string& dir) {
  const std::string tag = "global_step5";
  std::filesystem::create_directories(dir + "/" + tag);
  WriteAll(dir + "/latest", tag);
  const std::string flat = FixtureF32Bytes(12, 1.5f) + FixtureF32Bytes(3, -4.0f);
  const std::string steps = FixtureI64Bytes(2, 7);

  PickleWriter m;
  m.BeginDict(false);
  m.String("module");
  m.BeginDict(true);
  m.String("steps");  // storage "0": the model-states bytes that are read
  m.Tensor("LongStorage", "0", 2, {2}, {1});
  m.String("embed.weight");
  m.Tensor("BFloat16Storage", "1", 15, {4, 3}, {3, 1});
  m.String("ln.weight");
  m.Tensor("BFloat16Storage", "1", 15, {3}, {1});  // a view at offset 0: never read
  m.EndDict();
  m.String("buffer_names");
  m.BeginList();
  m.String("steps");
  m.EndList();
  m.String("optimizer");
  m.None();
  m.String("param_shapes");
  m.BeginList();
  m.BeginDict(true);
  m.String("embed.weight");
  m.BeginTuple();
  m.Int(4);
  m.Int(3);
  m.EndTuple();
  m.String("ln.weight");
  m.BeginTuple();
  m.Int(3);
  m.EndTuple();
  m.EndDict();
  m.EndList();
  m.String("mp_world_size");
  m.Int(1);
  m.String("ds_config");
  m.BeginDict(false);
  m.String("zero_optimization");
  m.BeginDict(false);
  m.String("stage");
  m.Int(2);
  m.EndDict();
  m.EndDict();
  m.EndDict();
  const std::string model_file = tag + "/mp_rank_00_model_states.pt";
  const TorchSaveFile model =
      BuildTorchSave(m.Finish(), {{"0", steps}, {"1", std::string(15 * 2, '\0')}});
  WriteAll(dir + "/" + model_file, model.bytes);

  std::vector<std::string> optim_files;
  std::vector<TorchSaveFile> optims;
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t numel = rank == 0 ? 8 : 7;
    PickleWriter o;
    o.BeginDict(false);
    o.String("optimizer_state_dict");
    o.BeginDict(false);
    o.String("zero_stage");
    o.Int(2);
    o.String("partition_count");
    o.BeginList();
    o.Int(2);
    o.EndList();
    o.String("single_partition_of_fp32_groups");
    o.BeginList();
    o.Tensor("FloatStorage", "0", numel, {numel}, {1});
    o.EndList();
    o.String("group_paddings");
    o.BeginList();
    o.Int(rank == 0 ? 0 : 1);
    o.EndList();
    o.EndDict();
    o.EndDict();
    optims.push_back(BuildTorchSave(o.Finish(), {{"0", flat.substr(rank * 8 * 4, numel * 4)}}));
    optim_files.push_back(absl::StrCat(tag, "/zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt"));
    WriteAll(dir + "/" + optim_files.back(), optims.back().bytes);
  }

  BuiltFixture fixture = TorchSaveFolderFixture(dir, optim_files[1], optims[1], "partition_count");
  for (FixtureDamage& damage : TorchSaveDamages(model_file, model, "buffer_names")) {
    fixture.damages.push_back(std::move(damage));
  }
  fixture.damages.push_back(
      {model_file + ": missing", model_file, FixtureDamage::Kind::kRemove, 0});
  fixture.expected = {{"steps", DType::kI64, {2}, steps},
                      {"embed.weight", DType::kF32, {4, 3}, flat.substr(0, 48)},
                      {"ln.weight", DType::kF32, {3}, flat.substr(48)}};
  return fixture;
}

const FormatFixtureRegistration register_no_zero("deepspeed-zero", "no-zero", BuildNoZeroFixture);
const FormatFixtureRegistration register_zero2("deepspeed-zero", "zero2", BuildZero2Fixture);

}  // namespace
}  // namespace reshard
