// DeepSpeed universal checkpoints for tests (the reader's unit tests), and the fixtures of the
// "deepspeed-universal" input format (universal_fixture.cc, see lib/formats/format_fixture.h),
// laid out as ds_to_universal.py writes them.
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_FIXTURE_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_FIXTURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/torch_fixture.h"

namespace reshard {

// One zero/<param>/<state>.pt file: an F32 tensor of `shape` holding `bytes` (row-major),
// pickled as {'cat_dim': cat_dim, 'param': tensor} (merge_tp_slices), with 'vocab_tensor': True
// when `vocab_tensor`, or as the bare flat 1-D tensor (merge_zero3_slices) when `bare`.
struct UniversalState {
  std::vector<int64_t> shape;
  std::string bytes;
  bool bare = false;
  int64_t cat_dim = 0;
  bool vocab_tensor = false;
};
TorchSaveFile WriteUniversalState(const std::string& path, const UniversalState& state);

struct UniversalFolderOptions {
  bool zero3 = false;   // bare tensors, zero_pp_rank_{0,1}_mp_rank_00_model_states.pt
  bool moments = true;  // exp_avg.pt and exp_avg_sq.pt beside every fp32.pt
  bool tracker = true;  // the input is the parent folder, with latest_universal

  // What ds_to_universal writes from ZeRO-3 without tensor parallelism, read directly.
  static UniversalFolderOptions ZeroThree() {
    UniversalFolderOptions options;
    options.zero3 = true;
    options.tracker = false;
    return options;
  }
};

// A universal folder `<dir>/global_step5_universal` of a model with trainable params
// embed.weight F32 [4, 3], ln.weight F32 [3] and head.bias F32 [1] (param_shapes in that
// order), the buffer steps I64 [2] in `module` (with 16-bit copies of the params under
// ZeRO-1/2, empty placeholders under ZeRO-3), universal_checkpoint_version 0.2, and
// zero/optimizer_state.pt. The fp32 values are FixtureF32Bytes(n, 1.5), (n, -4) and (n, 9);
// exp_avg and exp_avg_sq start at 100 and 200 more. `expected` lists the model without the
// moments; the damages are those of embed.weight's fp32.pt and of the read model-states file.
BuiltFixture WriteUniversalFolder(const std::string& dir, const UniversalFolderOptions& options);

// The fp32 bytes of the fixture's params, and of their moments (`offset` 100 or 200).
std::string UniversalFixtureBytes(const std::string& param, float offset = 0);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_FIXTURE_H_
