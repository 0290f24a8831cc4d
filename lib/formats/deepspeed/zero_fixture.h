// DeepSpeed model-states files for tests (the reader's unit tests), and the fixture of the
// "deepspeed-zero" input format (zero_fixture.cc, see lib/formats/format_fixture.h).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FIXTURE_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FIXTURE_H_

#include <cstdint>
#include <map>
#include <string>

#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"

namespace reshard {

// What a DeepSpeed model-states file says (engine._save_checkpoint).
struct ModelStates {
  bool module_none = false;   // the pipeline engine's `module`
  int zero_stage = 0;         // ds_config.zero_optimization.stage; -1: no zero_optimization
  bool bf16 = false;          // ds_config.bf16.enabled
  bool param_shapes = false;  // a ZeRO param_shapes list rather than None
  int64_t mp_world_size = 1;  // -1: not written
  int64_t rows = 4;           // of embed.weight (a TP part has fewer)
};

// A ds_config dict into `p`: {"zero_optimization": {"stage": `stage`}} (none when `stage` is
// -1), and {"bf16": {"enabled": True}} with `bf16`.
void WriteDeepSpeedConfig(PickleWriter& p, int stage, bool bf16);

// mp_rank_XX_model_states.pt: module {embed.weight f32 [rows, 3], lm_head.weight (tied: the
// same storage), ln.bias f16 [3], steps i64 [], layer._extra_state None}.
// Returns the archive written.
TorchSaveFile WriteModelStates(const std::string& path, const ModelStates& states);

// The "zero2" fixture's save folder (see zero_fixture.cc) whose optimizer files also hold the
// Adam state of the flat group at step 5 (base_optimizer_state.state[0]: exp_avg and exp_avg_sq
// are the fp32 values plus 100 and 200), as a universal checkpoint is made from. Not a
// registered fixture: the conformance suite expects deepspeed-universal to refuse every
// registered fixture, and runs that writer from this folder on its own.
// Returns the input path.
std::string WriteZeroFolderWithMoments(const std::string& dir);

// The files of a ZeRO-`stage` (2 or 3) save of `world` ranks, by path relative to the save
// folder ("latest" and global_step5/...): one trainable param "w" f32 [world, 8] holding
// FixtureF32Bytes(8 * world, 0), row r in rank r's flat group (no padding); the buffer "steps"
// i64 [2] holding FixtureI64Bytes(2, 7); ZeRO-3 also the frozen param "f" f32 [world, 2]
// holding FixtureF32Bytes(2 * world, 0), row r in rank r's model states. For tests of saves
// with many ranks.
std::map<std::string, std::string> ZeroSaveFiles(int stage, int world);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FIXTURE_H_
