// The fixture of the "deepspeed-zero" input format (see lib/formats/format_fixture.h): a
// DeepSpeed save folder without ZeRO partitioning, `latest` naming global_step3, whose
// mp_rank_00_model_states.pt holds the weights in its `module` (engine._save_checkpoint),
// one of them tied.

#include "lib/formats/deepspeed/zero_fixture.h"

#include <filesystem>
#include <string>

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

BuiltFixture BuildZeroFixture(const std::string& dir) {
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

const FormatFixtureRegistration register_fixture("deepspeed-zero", BuildZeroFixture);

}  // namespace
}  // namespace reshard
