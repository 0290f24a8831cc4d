// The "moe" fixture of "megatron-torch-dist" (lib/formats/format_fixture.h): a Megatron-Core
// mixture-of-experts GPT saved by dist_checkpointing at TP 2 x EP 2 (4 ranks, rank = t + 2 e),
// laid out as tests/fixtures/torch_dist_moe_fixture.py lays it out (SequentialMLP's form):
//
//   embedding.word_embeddings.weight, output_layer.weight  F32 [4, 2], rows split over TP
//   decoder.layers.mlp.router.weight                       F32 [2 layers, 4 experts, 2]
//   decoder.layers.mlp.experts.experts.linear_fc1.weight   F32 [2, 4, 4, 2]: per expert the
//       gated [gate; up] of 2 rows each; TP rank t's chunks are gate row t and up row t
//   decoder.layers.mlp.experts.experts.linear_fc2.weight   F32 [2, 4, 2, 2], columns over TP
//   decoder.final_layernorm.weight                         F32 [2]
//
// One chunk per (layer, expert, TP block) of the expert keys, stored by the ranks of the
// expert's EP rank (expert / 2); the other tensors once, by the ranks of EP rank 0. The reader
// gives layer l's expert g as decoder.layers.l.mlp.experts.local_experts.g.linear_fc{1,2}.weight.
// common.pt holds the args (TP 2, EP 2, 4 experts, SwiGLU; no attention), checkpoint_version
// 3.0 and the iteration.
//
// Damaged variants: a rank's file missing, a rank's file of another save in its place, files
// and `.metadata` cut short; each refused with one code, naming the file.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/formats/dcp/dcp_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using namespace dcp_testing;  // NOLINT: the pickle fragments
using Kind = FixtureDamage::Kind;

constexpr char kIter[] = "iter_0000010";
constexpr int kTp = 2;
constexpr int kEp = 2;
constexpr int kRanks = kTp * kEp;
constexpr int kLayers = 2;
constexpr int kExperts = 4;
constexpr int kLocal = kExperts / kEp;

// A chunk of a tensor and the rank that stores it.
struct StoredChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int rank = 0;
};

// A DCP tensor of the fixture: its key, row-major F32 values and chunks.
struct SavedTensor {
  std::string key;
  Shape shape;
  std::string bytes;
  std::vector<StoredChunk> chunks;
};

// The elements of `chunk` of the row-major F32 tensor `bytes` of `shape`, row-major.
std::string Slice(const std::string& bytes, const Shape& shape, const StoredChunk& chunk) {
  std::string out;
  std::vector<int64_t> index(shape.size(), 0);  // within the chunk
  int64_t count = 1;
  for (int64_t size : chunk.sizes) count *= size;
  for (int64_t n = 0; n < count; ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + chunk.offsets[d] + index[d];
    out.append(bytes, flat * 4, 4);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < chunk.sizes[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// The whole tensor, stored by rank 0.
std::vector<StoredChunk> Whole(const Shape& shape) {
  return {{std::vector<int64_t>(shape.size(), 0), shape, 0}};
}

// Rows of [rows, cols] split over TP, stored by the ranks of EP rank 0.
std::vector<StoredChunk> RowsOverTp(int64_t rows, int64_t cols) {
  std::vector<StoredChunk> chunks;
  for (int t = 0; t < kTp; ++t) chunks.push_back({{t * rows / kTp, 0}, {rows / kTp, cols}, t});
  return chunks;
}

// The model's tensors as saved, values counting up from `start` (another save: other values).
std::vector<SavedTensor> Model(float start) {
  std::vector<SavedTensor> tensors;
  auto add = [&](const std::string& key, const Shape& shape, std::vector<StoredChunk> chunks) {
    int64_t numel = 1;
    for (int64_t extent : shape) numel *= extent;
    tensors.push_back({key, shape, FixtureF32Bytes(numel, start), std::move(chunks)});
    start += 0.25f * static_cast<float>(numel);
  };
  add("embedding.word_embeddings.weight", {4, 2}, RowsOverTp(4, 2));
  add("decoder.layers.mlp.router.weight", {kLayers, kExperts, 2}, Whole({kLayers, kExperts, 2}));
  std::vector<StoredChunk> fc1, fc2;
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (int64_t expert = 0; expert < kExperts; ++expert) {
      const int base = kTp * static_cast<int>(expert / kLocal);
      for (int64_t block = 0; block < 2 * kTp; ++block) {  // gate rows, then up rows
        fc1.push_back(
            {{layer, expert, block, 0}, {1, 1, 1, 2}, static_cast<int>(block % kTp) + base});
      }
      for (int64_t t = 0; t < kTp; ++t) {
        fc2.push_back({{layer, expert, 0, t}, {1, 1, 2, 1}, static_cast<int>(t) + base});
      }
    }
  }
  add("decoder.layers.mlp.experts.experts.linear_fc1.weight", {kLayers, kExperts, 4, 2}, fc1);
  add("decoder.layers.mlp.experts.experts.linear_fc2.weight", {kLayers, kExperts, 2, 2}, fc2);
  add("decoder.final_layernorm.weight", {2}, Whole({2}));
  add("output_layer.weight", {4, 2}, RowsOverTp(4, 2));
  return tensors;
}

// The upper halves of F32 `bytes`: BF16.
std::string Bf16Of(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i + 4 <= bytes.size(); i += 4) out.append(bytes, i + 2, 2);
  return out;
}

// The rank files' bytes (__{rank}_0.distcp) and the `.metadata` pickle of `tensors`, saved in
// F32 or, with `bf16`, in BF16.
std::pair<std::vector<std::string>, std::string> Save(const std::vector<SavedTensor>& tensors,
                                                      bool bf16 = false) {
  std::vector<std::string> files(kRanks);
  std::vector<std::pair<std::string, std::string>> storage, sdm;
  int64_t index = 0;
  for (const SavedTensor& tensor : tensors) {
    std::vector<std::string> chunks;
    for (const StoredChunk& chunk : tensor.chunks) {
      int64_t numel = 1;
      for (int64_t size : chunk.sizes) numel *= size;
      const std::string bytes = Slice(tensor.bytes, tensor.shape, chunk);
      const TorchSaveFile item =
          bf16 ? TensorItem("BFloat16Storage", numel, chunk.sizes, Bf16Of(bytes))
               : TensorItem("FloatStorage", numel, chunk.sizes, bytes);
      const std::string name = absl::StrCat("__", chunk.rank, "_0.distcp");
      std::string& file = files[chunk.rank];
      storage.push_back(
          {Index(tensor.key, &chunk.offsets, index++),
           Info(name, static_cast<int64_t>(file.size()), static_cast<int64_t>(item.bytes.size()))});
      file += item.bytes;
      chunks.push_back(Chunk(chunk.offsets, chunk.sizes));
    }
    sdm.push_back({Str(tensor.key),
                   TensorMd(Properties(bf16 ? "bfloat16" : "float32", kMd), tensor.shape, chunks)});
  }
  return {files, Metadata(Dict(sdm), Dict(storage))};
}

// The tensors the reader gives: layers unstacked, each expert under its global id.
std::vector<FixtureTensor> Expected(const std::vector<SavedTensor>& tensors) {
  std::vector<FixtureTensor> expected;
  for (const SavedTensor& tensor : tensors) {
    const std::string key = tensor.key;
    const size_t stacked = key.find("layers.");
    if (stacked == std::string::npos) {
      expected.push_back({key, DType::kF32, tensor.shape, tensor.bytes});
      continue;
    }
    const std::string before = key.substr(0, stacked + 7), after = key.substr(stacked + 7);
    const bool experts = after.rfind("mlp.experts.experts.", 0) == 0;
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      if (!experts) {
        const Shape shape(tensor.shape.begin() + 1, tensor.shape.end());
        StoredChunk whole{{layer}, {1}, 0};
        for (int64_t extent : shape) {
          whole.offsets.push_back(0);
          whole.sizes.push_back(extent);
        }
        expected.push_back({absl::StrCat(before, layer, ".", after), DType::kF32, shape,
                            Slice(tensor.bytes, tensor.shape, whole)});
        continue;
      }
      const std::string rest = after.substr(std::string("mlp.experts.experts.").size());
      for (int64_t expert = 0; expert < kExperts; ++expert) {
        const Shape shape(tensor.shape.begin() + 2, tensor.shape.end());
        StoredChunk one{{layer, expert, 0, 0}, {1, 1, shape[0], shape[1]}, 0};
        expected.push_back(
            {absl::StrCat(before, layer, ".mlp.experts.local_experts.", expert, ".", rest),
             DType::kF32, shape, Slice(tensor.bytes, tensor.shape, one)});
      }
    }
  }
  return expected;
}

// The run's argparse.Namespace, as megatron_moe_fixture.args_of gives it (no attention).
void WriteArgs(PickleWriter& p) {
  p.Global("argparse", "Namespace");
  p.BeginTuple();
  p.EndTuple();
  p.NewObj();
  p.BeginDict(false);
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, int64_t>>{{"num_layers", kLayers},
                                                    {"hidden_size", 2},
                                                    {"ffn_hidden_size", 2},
                                                    {"moe_ffn_hidden_size", 2},
                                                    {"padded_vocab_size", 4},
                                                    {"tensor_model_parallel_size", kTp},
                                                    {"pipeline_model_parallel_size", 1},
                                                    {"expert_model_parallel_size", kEp},
                                                    {"expert_tensor_parallel_size", kTp},
                                                    {"num_experts", kExperts},
                                                    {"rank", 0},
                                                    {"world_size", kRanks},
                                                    {"iteration", 10}}) {
    p.String(key);
    p.Int(value);
  }
  for (const char* flag : {"swiglu", "untie_embeddings_and_output_weights"}) {
    p.String(flag);
    p.Bool(true);
  }
  p.String("moe_grouped_gemm");
  p.Bool(false);
  p.EndDict();
  p.Build();
}

BuiltFixture BuildTorchDistMoeFixture(const std::string& save_dir) {
  const std::string dir = save_dir + "/" + kIter;
  std::filesystem::create_directories(dir);
  WriteAll(save_dir + "/latest_checkpointed_iteration.txt", "10\n");
  const std::vector<SavedTensor> model = Model(1.5f);
  const auto [files, metadata] = Save(model);
  for (int rank = 0; rank < kRanks; ++rank) {
    WriteAll(absl::StrCat(dir, "/__", rank, "_0.distcp"), files[rank]);
  }
  WriteAll(dir + "/.metadata", metadata);
  PickleWriter common;
  common.BeginDict(false);
  common.String("args");
  WriteArgs(common);
  common.String("checkpoint_version");
  common.Float(3.0);
  common.String("iteration");
  common.Int(10);
  common.EndDict();
  WriteAll(dir + "/common.pt", BuildTorchSave(common.Finish(), {}).bytes);
  WriteAll(dir + "/metadata.json",
           R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");

  BuiltFixture fixture;
  fixture.input = save_dir;
  fixture.expected = Expected(model);
  const std::string iter = std::string(kIter) + "/";
  const std::string rank3 = iter + "__3_0.distcp";
  fixture.damages = {
      {"__3_0.distcp: missing", rank3, Kind::kRemove, 0},
      {".metadata: truncated halfway", iter + ".metadata", Kind::kTruncate, metadata.size() / 2},
      {"__3_0.distcp: one byte short", rank3, Kind::kTruncate, files[3].size() - 1},
      {"__2_0.distcp: truncated halfway", iter + "__2_0.distcp", Kind::kTruncate,
       files[2].size() / 2},
  };
  // Rank 3's file of another save of the model, in BF16: its records are not where this
  // save's .metadata places them.
  FixtureDamage mixed{
      "__3_0.distcp: of another save", rank3, Kind::kReplace, 0, false, false, false,
      absl::StatusCode::kDataLoss};
  mixed.replacement = Save(model, /*bf16=*/true).first[3];
  fixture.damages.push_back(std::move(mixed));
  for (FixtureDamage& damage : fixture.damages) {
    damage.named = std::filesystem::path(damage.file).filename();
  }
  return fixture;
}

const FormatFixtureRegistration register_fixture("megatron-torch-dist", "moe",
                                                 BuildTorchDistMoeFixture);

}  // namespace
}  // namespace reshard
