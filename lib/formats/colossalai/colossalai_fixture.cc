// The fixture of the "colossalai-dist" input format (see lib/formats/format_fixture.h): two
// tensor-parallel ranks of a ColossalAI distributed checkpoint in unsharded mode with
// safetensors weights, as PR #6181 writes them: rank 0's metadata gives the saving machine's
// absolute path as `file`, rank 1's a bare name. embed.weight is split by rows, ln.weight and
// steps are replicated in both ranks' files.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "lib/formats/colossalai/colossalai_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/safetensors/safetensors_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

std::string MetaJson(int rank, const std::string& file) {
  const int64_t rows = 2;
  return absl::StrFormat(
      R"({
    "checkpoint_version": "1.0",
    "total_size": null,
    "metadata": {
        "embed.weight": {"offsets": [%d, 0], "lengths": [%d, 3], "global_shape": [4, 3],
                         "file": "%s", "rank": %d},
        "ln.weight": {"offsets": [0], "lengths": [3], "global_shape": [3], "file": "%s",
                      "rank": %d},
        "steps": {"offsets": [0], "lengths": [2], "global_shape": [2], "file": "%s", "rank": %d}
    }
})",
      rank * rows, rows, file, rank, file, rank, file, rank);
}

BuiltFixture BuildColossalFixture(const std::string& dir) {
  using Kind = FixtureDamage::Kind;
  const std::vector<FixtureTensor> tensors =
      ThreeFixtureTensors({"embed.weight", "ln.weight", "steps"});
  std::vector<std::string> weights, metas;
  for (int rank = 0; rank < 2; ++rank) {
    FixtureTensor rows = tensors[0];
    rows.shape = {2, 3};
    rows.bytes = tensors[0].bytes.substr(rank * 24, 24);
    const std::string weight = absl::StrFormat("pytorch_model-dist-%05d.safetensors", rank);
    const std::string meta = absl::StrFormat("pytorch_model-meta-dist-%05d.index.json", rank);
    WriteAll(dir + "/" + weight, SafetensorsFileOf({rows, tensors[1], tensors[2]}));
    const std::string file = rank == 0 ? "/saving/machine/ckpt/" + weight : weight;
    WriteAll(dir + "/" + meta, MetaJson(rank, file));
    weights.push_back(weight);
    metas.push_back(meta);
  }
  const std::string rank0 = ReadAll(dir + "/" + weights[0]);
  const uint64_t data_begin = rank0.size() - (24 + tensors[1].bytes.size() + 16);
  BuiltFixture fixture;
  fixture.input = dir;
  fixture.expected = tensors;
  fixture.damages = {
      {"rank 1's weight file missing", weights[1], Kind::kRemove, 0},
      // Only rank 0 is left: rows [2, 4) of embed.weight are a hole.
      {"rank 1's metadata file missing", metas[1], Kind::kRemove, 0, false, false, false,
       absl::StatusCode::kDataLoss},
      {"rank 0's metadata truncated halfway", metas[0], Kind::kTruncate, 60},
      {"flipped byte in rank 1's metadata JSON", metas[1], Kind::kFlip, 0},
      {"rank 0's weight file truncated inside tensor data", weights[0], Kind::kTruncate,
       data_begin + 5},
      {"flipped byte in rank 0's header length", weights[0], Kind::kFlip, 0},
      // safetensors keeps no checksum: nothing can notice a changed data byte.
      {"flipped byte in rank 0's tensor data (no checksum to catch it)", weights[0], Kind::kFlip,
       data_begin + 5, /*in_checksummed_data=*/false, /*undetectable=*/true},
  };
  return fixture;
}

const FormatFixtureRegistration register_fixture("colossalai-dist", BuildColossalFixture);

}  // namespace

std::map<std::string, std::string> ColossalSaveFiles(int world) {
  const std::string w = FixtureF32Bytes(8 * int64_t{world}, 0);
  std::map<std::string, std::string> files;
  for (int rank = 0; rank < world; ++rank) {
    const std::string weight = absl::StrFormat("pytorch_model-dist-%05d.safetensors", rank);
    files[weight] = SafetensorsFileOf({FixtureTensor{"w", DType::kF32, {1, 8},
                                                     w.substr(rank * 32, 32)}});
    files[absl::StrFormat("pytorch_model-meta-dist-%05d.index.json", rank)] = absl::StrFormat(
        R"({"checkpoint_version": "1.0", "total_size": null, "metadata": {"w": {"offsets": [%d, 0],
 "lengths": [1, 8], "global_shape": [%d, 8], "file": "%s", "rank": %d}}})",
        rank, world, weight, rank);
  }
  return files;
}
}  // namespace reshard
