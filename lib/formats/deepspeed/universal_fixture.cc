// The fixtures of the "deepspeed-universal" input format (see lib/formats/format_fixture.h): a
// universal folder converted from ZeRO-2 (dict-form .pt files, read through the parent's
// latest_universal) and one converted from ZeRO-3 without tensor parallelism (bare flat
// tensors, shaped from param_shapes), as ds_to_universal.py writes them.

#include "lib/formats/deepspeed/universal_fixture.h"

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

namespace {

constexpr char kTag[] = "global_step5_universal";

struct FixtureParam {
  const char* name;
  std::vector<int64_t> shape;
  float start;
};

// The trainable params, in param_shapes order (not name order: the reader must keep it).
const std::vector<FixtureParam>& Params() {
  static const auto* const params = new std::vector<FixtureParam>{
      {"embed.weight", {4, 3}, 1.5f}, {"ln.weight", {3}, -4.0f}, {"head.bias", {1}, 9.0f}};
  return *params;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void IntTuple(PickleWriter& p, const std::vector<int64_t>& values) {
  p.BeginTuple();
  for (int64_t v : values) p.Int(v);
  p.EndTuple();
}

// A model-states file as the engine saves it and ds_to_universal copies it: `module` holds the
// buffer steps (storage "0", read) and the params (ZeRO-1/2: 16-bit copies, storage "1";
// ZeRO-3: empty placeholders), param_shapes one group, universal_checkpoint_info.
TorchSaveFile WriteModelStates(const std::string& path, bool zero3, const std::string& steps) {
  PickleWriter p;
  p.BeginDict(false);
  p.String("module");
  p.BeginDict(true);
  p.String("steps");
  p.Tensor("LongStorage", "0", 2, {2}, {1});
  for (const FixtureParam& param : Params()) {
    p.String(param.name);
    if (zero3) {
      p.Tensor("BFloat16Storage", "1", 0, {0}, {1});
    } else {
      p.Tensor("BFloat16Storage", "1", 16, param.shape,
               param.shape.size() == 2 ? std::vector<int64_t>{3, 1} : std::vector<int64_t>{1});
    }
  }
  p.EndDict();
  p.String("buffer_names");
  p.BeginList();
  p.String("steps");
  p.EndList();
  p.String("param_shapes");
  p.BeginList();
  p.BeginDict(true);
  for (const FixtureParam& param : Params()) {
    p.String(param.name);
    IntTuple(p, param.shape);
  }
  p.EndDict();
  p.EndList();
  p.String("frozen_param_shapes");
  p.None();
  p.String("shared_params");
  p.BeginDict(false);
  p.EndDict();
  p.String("universal_checkpoint_info");
  p.BeginDict(false);
  p.String("universal_checkpoint_version");
  p.Float(0.2);
  p.EndDict();
  p.String("mp_world_size");
  p.Int(1);
  p.EndDict();
  TorchSaveFile archive =
      BuildTorchSave(p.Finish(), {{"0", steps}, {"1", std::string(zero3 ? 0 : 16 * 2, '\0')}});
  WriteAll(path, archive.bytes);
  return archive;
}

// zero/optimizer_state.pt: what remains of the optimizer state dict (not read).
void WriteOptimizerState(const std::string& path, bool zero3) {
  PickleWriter p;
  p.BeginDict(false);
  p.String("zero_stage");
  p.Int(zero3 ? 3 : 2);
  p.String("param_groups");
  p.BeginList();
  p.BeginDict(false);
  p.String("lr");
  p.Float(0.001);
  p.EndDict();
  p.EndList();
  p.EndDict();
  WriteAll(path, BuildTorchSave(p.Finish(), {}).bytes);
}

}  // namespace

TorchSaveFile WriteUniversalState(const std::string& path, const UniversalState& state) {
  const int64_t numel = static_cast<int64_t>(state.bytes.size() / 4);
  PickleWriter p;
  if (state.bare) {
    p.Tensor("FloatStorage", "0", numel, {numel}, {1});
  } else {
    p.BeginDict(false);
    p.String("cat_dim");
    p.Int(state.cat_dim);
    if (state.vocab_tensor) {
      p.String("vocab_tensor");
      p.Bool(true);
    }
    p.String("param");
    std::vector<int64_t> strides(state.shape.size(), 1);
    for (int d = static_cast<int>(state.shape.size()) - 2; d >= 0; --d) {
      strides[d] = strides[d + 1] * state.shape[d + 1];
    }
    p.Tensor("FloatStorage", "0", numel, state.shape, strides);
    p.EndDict();
  }
  TorchSaveFile archive = BuildTorchSave(p.Finish(), {{"0", state.bytes}});
  WriteAll(path, archive.bytes);
  return archive;
}

std::string UniversalFixtureBytes(const std::string& param, float offset) {
  for (const FixtureParam& p : Params()) {
    if (param == p.name) return FixtureF32Bytes(Numel(p.shape), p.start + offset);
  }
  return "";
}

BuiltFixture WriteUniversalFolder(const std::string& dir, const UniversalFolderOptions& options) {
  const std::string folder = absl::StrCat(dir, "/", kTag);
  std::filesystem::create_directories(folder + "/zero");
  if (options.tracker) WriteAll(dir + "/latest_universal", kTag);
  const std::string steps = FixtureI64Bytes(2, 7);
  std::string model_file;
  TorchSaveFile model;
  for (int rank = 0; rank < (options.zero3 ? 2 : 1); ++rank) {
    const std::string name =
        options.zero3 ? absl::StrCat("zero_pp_rank_", rank, "_mp_rank_00_model_states.pt")
                      : "mp_rank_00_model_states.pt";
    TorchSaveFile archive = WriteModelStates(folder + "/" + name, options.zero3, steps);
    if (rank == 0) {
      model_file = absl::StrCat(kTag, "/", name);
      model = std::move(archive);
    }
  }
  WriteOptimizerState(folder + "/zero/optimizer_state.pt", options.zero3);
  std::string fp32_file;
  TorchSaveFile fp32;
  for (const FixtureParam& param : Params()) {
    const std::string param_dir = absl::StrCat(folder, "/zero/", param.name);
    std::filesystem::create_directories(param_dir);
    UniversalState state{param.shape, UniversalFixtureBytes(param.name), options.zero3};
    TorchSaveFile archive = WriteUniversalState(param_dir + "/fp32.pt", state);
    if (fp32_file.empty()) {
      fp32_file = absl::StrCat(kTag, "/zero/", param.name, "/fp32.pt");
      fp32 = std::move(archive);
    }
    if (options.moments) {
      state.bytes = UniversalFixtureBytes(param.name, 100);
      WriteUniversalState(param_dir + "/exp_avg.pt", state);
      state.bytes = UniversalFixtureBytes(param.name, 200);
      WriteUniversalState(param_dir + "/exp_avg_sq.pt", state);
    }
    if (!options.zero3) {  // merge_tp_slices saves the step, a bare value
      PickleWriter p;
      p.Int(5);
      WriteAll(param_dir + "/step.pt", BuildTorchSave(p.Finish(), {}).bytes);
    }
  }
  BuiltFixture fixture =
      TorchSaveFolderFixture(dir, fp32_file, fp32, options.zero3 ? "storage" : "cat_dim");
  if (!options.tracker) fixture.input = folder;
  for (FixtureDamage& damage : TorchSaveDamages(model_file, model, "buffer_names")) {
    fixture.damages.push_back(std::move(damage));
  }
  const std::string ln = absl::StrCat(kTag, "/zero/ln.weight/fp32.pt");
  fixture.damages.push_back({ln + ": missing", ln, FixtureDamage::Kind::kRemove, 0});
  // A parameter's fp32.pt missing from the save: an incomplete checkpoint.
  for (FixtureDamage& damage : fixture.damages) {
    if (damage.kind == FixtureDamage::Kind::kRemove) damage.code = absl::StatusCode::kDataLoss;
  }
  for (const FixtureParam& param : Params()) {
    fixture.expected.push_back(
        {param.name, DType::kF32, param.shape, UniversalFixtureBytes(param.name)});
  }
  fixture.expected.push_back({"steps", DType::kI64, {2}, steps});
  return fixture;
}

namespace {

BuiltFixture BuildZero2Fixture(const std::string& dir) {
  return WriteUniversalFolder(dir, UniversalFolderOptions{});
}

BuiltFixture BuildZero3Fixture(const std::string& dir) {
  return WriteUniversalFolder(dir, UniversalFolderOptions::ZeroThree());
}

const FormatFixtureRegistration register_zero2("deepspeed-universal", "zero2", BuildZero2Fixture);
const FormatFixtureRegistration register_zero3("deepspeed-universal", "zero3", BuildZero3Fixture);

}  // namespace
}  // namespace reshard
