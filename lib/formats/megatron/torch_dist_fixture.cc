// The conformance fixture of "megatron-torch-dist" (lib/formats/format_fixture.h): a Megatron-LM
// save folder whose tracker names iter_0000010/, a torch_dist checkpoint of 2 tensor-parallel
// ranks: decoder.layers.linear.weight F32 [2 layers, 4, 3] layer-stacked, each chunk one
// layer's half of the rows; embedding.word_embeddings.weight BF16 [3] and output_layer.steps
// I64 [2] whole. Read back unstacked: decoder.layers.0.linear.weight and
// decoder.layers.1.linear.weight F32 [4, 3].

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "lib/formats/dcp/dcp_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using namespace dcp_testing;  // NOLINT: the pickle fragments

constexpr char kIter[] = "iter_0000010";

BuiltFixture BuildTorchDistFixture(const std::string& save_dir) {
  using Kind = FixtureDamage::Kind;
  const std::string dir = save_dir + "/" + kIter;
  std::filesystem::create_directories(dir);
  WriteAll(save_dir + "/latest_checkpointed_iteration.txt", "10\n");
  WriteAll(dir + "/metadata.json",
           R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");

  // The stacked weight, row-major [2, 4, 3]; chunk (layer l, rank r) holds rows 2r, 2r + 1.
  const std::string stacked = FixtureF32Bytes(24, 1.5f);
  std::vector<TorchSaveFile> chunks;  // (l, r) at l * 2 + r
  for (int layer = 0; layer < 2; ++layer) {
    for (int rank = 0; rank < 2; ++rank) {
      chunks.push_back(TensorItem("FloatStorage", 6, {1, 2, 3},
                                  stacked.substr((layer * 12 + rank * 6) * 4, 24)));
    }
  }
  const TorchSaveFile embed = TensorItem("BFloat16Storage", 3, {3}, FixtureBF16Bytes(3, -2.0f));
  const TorchSaveFile steps = TensorItem("LongStorage", 2, {2}, FixtureI64Bytes(2, 7));
  // Rank 0: its two chunks, then the embedding; rank 1: its two chunks, then steps.
  std::string files[2];
  std::vector<std::pair<std::string, std::string>> storage;
  const std::string w = "decoder.layers.linear.weight";
  for (int rank = 0; rank < 2; ++rank) {
    const std::string name = "__" + std::to_string(rank) + "_0.distcp";
    for (int layer = 0; layer < 2; ++layer) {
      const TorchSaveFile& chunk = chunks[layer * 2 + rank];
      const std::vector<int64_t> offsets = {layer, 2 * rank, 0};
      storage.push_back({Index(w, &offsets, layer * 2 + rank),
                         Info(name, static_cast<int64_t>(files[rank].size()),
                              static_cast<int64_t>(chunk.bytes.size()))});
      files[rank] += chunk.bytes;
    }
    const TorchSaveFile& whole = rank == 0 ? embed : steps;
    const std::vector<int64_t> zero = {0};
    storage.push_back(
        {Index(rank == 0 ? "embedding.word_embeddings.weight" : "output_layer.steps", &zero, 0),
         Info(name, static_cast<int64_t>(files[rank].size()),
              static_cast<int64_t>(whole.bytes.size()))});
    files[rank] += whole.bytes;
    WriteAll(dir + "/" + name, files[rank]);
  }
  std::vector<std::string> w_chunks;
  for (int layer = 0; layer < 2; ++layer) {
    for (int rank = 0; rank < 2; ++rank) w_chunks.push_back(Chunk({layer, 2 * rank, 0}, {1, 2, 3}));
  }
  const std::string sdm = Dict({
      {Str(w), TensorMd(Properties("float32", kMd), {2, 4, 3}, w_chunks)},
      {Str("embedding.word_embeddings.weight"),
       TensorMd(Properties("bfloat16", kMd), {3}, {Chunk({0}, {3})})},
      {Str("output_layer.steps"), TensorMd(Properties("int64", kMd), {2}, {Chunk({0}, {2})})},
  });
  const std::string metadata = Metadata(sdm, Dict(storage));
  WriteAll(dir + "/.metadata", metadata);

  BuiltFixture fixture;
  fixture.input = save_dir;
  std::vector<FixtureTensor> three = ThreeFixtureTensors(
      {"decoder.layers.0.linear.weight", "embedding.word_embeddings.weight", "output_layer.steps"});
  fixture.expected = {three[0],
                      {"decoder.layers.1.linear.weight",
                       DType::kF32,
                       {4, 3},
                       FixtureF32Bytes(12, 1.5f + 0.25f * 12)},
                      three[1],
                      three[2]};
  const std::string iter = std::string(kIter) + "/";
  fixture.damages = {
      // Megatron-Core writes metadata.json last: without it the save is incomplete.
      {"metadata.json: missing", iter + "metadata.json", Kind::kRemove, 0, false, false, false,
       absl::StatusCode::kDataLoss},
      {"metadata.json: truncated to 0 bytes", iter + "metadata.json", Kind::kTruncate, 0},
      {".metadata: missing", iter + ".metadata", Kind::kRemove, 0},
      {".metadata: truncated halfway", iter + ".metadata", Kind::kTruncate, metadata.size() / 2},
      {"__1_0.distcp: missing", iter + "__1_0.distcp", Kind::kRemove, 0},
      {"__0_0.distcp: one byte short", iter + "__0_0.distcp", Kind::kTruncate, files[0].size() - 1},
      {"tracker: names another iteration", "latest_checkpointed_iteration.txt", Kind::kFlip, 0,
       /*in_checksummed_data=*/false, /*undetectable=*/false, /*names_missing_file=*/true},
  };
  for (FixtureDamage& damage : TorchSaveDamages(iter + "__1_0.distcp", chunks[1], "FloatStorage", 0,
                                                /*whole_file=*/false)) {
    fixture.damages.push_back(std::move(damage));
  }
  return fixture;
}

const FormatFixtureRegistration register_fixture("megatron-torch-dist", BuildTorchDistFixture);

}  // namespace
}  // namespace reshard
