// Golden outputs: a fixed set of conversions, run on the conformance suite's fixtures
// (lib/formats/format_fixture.h, written at run time), must give the same bytes as recorded in
// lib/engine/golden_outputs.txt: every output file's size and XXH3-64, one line per file
//
//   <conversion id> <file, relative to the output folder> <bytes> <xxh3-64, 16 hex digits>
//
// It covers every writer (safetensors single, sharded with an index, bf16, fp16, tied weights
// aliased and duplicated, parts; torch single, sharded, parts; olmo-safetensors; torch-dcp
// consolidated and resharded to 2 and 3 ranks; megatron TP 2 x PP 2, and TP 2 from Hugging Face
// Mixtral and Llama folders; megatron-torch-dist TP 2 from Megatron-LM saves and from a Hugging
// Face Llama folder; hf from a Megatron-LM Llama save at TP 2 x PP 2 (with --family and
// --config), from its torch_dist form and from a Qwen2 save with a QKV bias and tied embeddings
// (lib/testing/hf_megatron_fixture.h); Megatron-LM and Megatron-Core torch_dist at TP 2 x EP 2
// from a torch_dist mixture-of-experts save; deepspeed-universal from a ZeRO-2 save folder with
// Adam moments, with the latest_universal written beside the output, listed as
// "../latest_universal") and consolidation to safetensors of every registered input fixture
// (and of a DeepSpeed MoE ZeRO-2 save with its Adam moments). A new fixture adds a conversion,
// which fails until its lines are recorded.
//
// reshard-manifest.json holds a creation time, the input's path and the paths of the files the
// request names beside it (--config, --tokenizer), the tool's version (a release changes it,
// not the bytes of any format) and, for daemon jobs and partitioned conversions, a
// job and split id: those fields are removed and the rest (source format and layout, request,
// files with their XXH3-64, tensors) is compared, as the XXH3-64 of the remainder re-serialized
// by nlohmann::ordered_json (dump(2)).
//
// Each conversion runs twice, on fixtures written into different folders, once with the
// defaults (2 threads, 32 MiB windows, direct I/O where it can) and once with 1 thread, 4 KiB
// windows and buffered I/O, and must give the same bytes both times: outputs depend neither on
// the run, nor on where the input is, nor on how the executor is set up. Two conversions run as
// partitioned conversions (workers one after the other) and four write to s3:// (an in-memory S3
// client; the objects under the output prefix are compared as files).
//
// An intended change of an output format updates the expected file in the same commit:
//
//   RESHARD_GOLDEN_UPDATE=$PWD/lib/engine/golden_outputs.txt bazel run //lib/engine:golden_outputs_test
//
// (bazel run, not bazel test: the test writes into the source tree.) A new conversion leaves the
// recorded lines as they are: write the whole set elsewhere (RESHARD_GOLDEN_UPDATE=/tmp/all.txt)
// and append the new conversion's lines to the file.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "lib/engine/conversion.h"
#include "lib/engine/object_store_output.h"
#include "lib/engine/partitioned_conversion.h"
#include "lib/formats/deepspeed/moe_fixture.h"
#include "lib/formats/deepspeed/zero_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/safetensors/safetensors_fixture.h"
#include "lib/io/io_mode.h"
#include "lib/io/s3/s3_store.h"
#include "lib/io/s3/testing/memory_s3_client.h"
#include "lib/testing/hf_megatron_fixture.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

constexpr char kExpectedFile[] = "lib/engine/golden_outputs.txt";
constexpr char kUpdateEnv[] = "RESHARD_GOLDEN_UPDATE";
constexpr char kUpdateCommand[] =
    "RESHARD_GOLDEN_UPDATE=$PWD/lib/engine/golden_outputs.txt bazel run "
    "//lib/engine:golden_outputs_test";

// Inline partition rules for the safetensors fixture (embed.weight [4, 3], ln.weight [3],
// steps [2]): embed.weight by columns, ln.weight by rows, so that 3 ranks divide both.
constexpr char kThreeWayRules[] =
    R"({"rules": [{"pattern": "^embed\\.weight$", "split_dim": 1},)"
    R"( {"pattern": "^ln\\.weight$", "split_dim": 0}, {"pattern": ".*", "replicate": true}]})";

// One conversion: an input written at run time into an empty folder (returning what to give
// the reader), and the spec's fields besides input and output.
struct GoldenConversion {
  std::string id;
  std::function<std::string(const std::string& dir)> input;
  std::function<void(ConversionSpec&)> configure;
  // > 0: run as that many workers of a partitioned conversion (partitioned_conversion.h), one
  // after the other; the last one publishes.
  int partitions = 0;
  // Written as objects under an s3:// prefix (object_store_output.h), to an in-memory S3.
  bool to_s3 = false;
};

std::function<void(ConversionSpec&)> Consolidate(const std::string& format) {
  return [format](ConversionSpec& spec) {
    spec.kind = ConversionSpec::Kind::kConsolidate;
    spec.output_format = format;
  };
}

std::function<void(ConversionSpec&)> Reshard(const std::string& format, int parts,
                                             const std::string& rules_json = "") {
  return [format, parts, rules_json](ConversionSpec& spec) {
    spec.kind = ConversionSpec::Kind::kReshard;
    spec.output_format = format;
    spec.parts = parts;
    spec.rules_json = rules_json;
  };
}

// A configure step followed by `then`.
std::function<void(ConversionSpec&)> With(std::function<void(ConversionSpec&)> first,
                                          std::function<void(ConversionSpec&)> then) {
  return [first, then](ConversionSpec& spec) {
    first(spec);
    then(spec);
  };
}

// A safetensors file for the casts: the safetensors fixture's tensors and an F32 [40] tensor
// whose values are not exact in bf16 or fp16 (low mantissa bits above, below and exactly at
// half of the last kept bit, both signs, fp16 subnormals and overflow), so that any change in
// rounding changes bytes.
std::string WriteRoundingInput(const std::string& dir) {
  std::vector<FixtureTensor> tensors = ThreeFixtureTensors({"embed.weight", "ln.weight", "steps"});
  std::vector<uint32_t> bits;
  for (uint32_t i = 0; i < 32; ++i) bits.push_back(0x3f800000u + i * 0x00012345u);
  for (uint32_t special : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818001u, 0x33800001u,
                           0x38a00000u, 0x477ff000u, 0x47800000u}) {
    bits.push_back(special);
  }
  std::string bytes(bits.size() * 4, '\0');
  std::memcpy(bytes.data(), bits.data(), bytes.size());
  tensors.push_back({"rounding", DType::kF32, {static_cast<int64_t>(bits.size())}, bytes});
  const std::string path = dir + "/model.safetensors";
  WriteAll(path, SafetensorsFileOf(tensors));
  return path;
}

// A Hugging Face Mixtral folder (model.safetensors and config.json): one layer of two query
// heads in two groups, a router over 2 experts of intermediate size 2, vocabulary 5, untied;
// every F32 value distinct, so that a tensor written in another place changes bytes.
std::string WriteHfMixtralInput(const std::string& dir) {
  float next = 0.5f;
  auto tensor = [&](std::string name, Shape shape) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    std::vector<float> values(count);
    for (float& value : values) value = (next += 0.25f);
    std::string bytes(values.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return FixtureTensor{std::move(name), DType::kF32, std::move(shape), std::move(bytes)};
  };
  std::vector<FixtureTensor> tensors = {tensor("model.embed_tokens.weight", {5, 4})};
  const std::string layer = "model.layers.0.";
  for (const char* name : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
    tensors.push_back(tensor(layer + name, {4}));
  }
  for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    tensors.push_back(tensor(absl::StrCat(layer, "self_attn.", name, ".weight"), {4, 4}));
  }
  tensors.push_back(tensor(layer + "block_sparse_moe.gate.weight", {2, 4}));
  for (int expert = 0; expert < 2; ++expert) {
    const std::string prefix = absl::StrCat(layer, "block_sparse_moe.experts.", expert, ".");
    tensors.push_back(tensor(prefix + "w1.weight", {2, 4}));
    tensors.push_back(tensor(prefix + "w2.weight", {4, 2}));
    tensors.push_back(tensor(prefix + "w3.weight", {2, 4}));
  }
  tensors.push_back(tensor("model.norm.weight", {4}));
  tensors.push_back(tensor("lm_head.weight", {5, 4}));
  WriteAll(dir + "/model.safetensors", SafetensorsFileOf(tensors));
  WriteAll(dir + "/config.json",
           R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", )"
           R"("hidden_size": 4, "intermediate_size": 2, "num_hidden_layers": 1, )"
           R"("num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 2, )"
           R"("max_position_embeddings": 16, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, )"
           R"("vocab_size": 5, "tie_word_embeddings": false, "sliding_window": null, )"
           R"("num_local_experts": 2, "num_experts_per_tok": 1, "router_aux_loss_coef": 0.02})");
  return dir;
}

// The Llama model of lib/testing/hf_megatron_fixture.h: 4 query heads in 2 groups, SwiGLU,
// untied, vocabulary 10 padded to 12.
const HfLlamaModel kLlama;

// A Qwen2 model of the same sizes: a QKV bias, 4 heads in 4 groups, tied.
const HfLlamaModel kQwen2 = [] {
  HfLlamaModel model;
  model.groups = 4;
  model.qkv_bias = true;
  model.tied = true;
  return model;
}();

// A Megatron-LM save of kLlama at TP 2 x PP 2 in `dir`/save, and beside it (outside the save)
// the --config file of HfConfigOverrides.
std::string WriteMegatronLlamaInput(const std::string& dir) {
  fs::create_directories(dir + "/save");
  WriteAll(dir + "/config-overrides.json", R"({"bos_token_id": 1, "eos_token_id": 2})");
  return WriteMegatronLlamaSave(dir + "/save", kLlama, 2, 2);
}

// --format hf --family llama --config <the file WriteMegatronLlamaInput writes beside the save>.
void HfConfigOverrides(ConversionSpec& spec) {
  spec.hf.family = "llama";
  spec.hf.config_file = (fs::path(spec.input).parent_path() / "config-overrides.json").string();
}

// The Megatron-LM save of WriteMegatronLlamaInput written as a Megatron-Core torch_dist
// checkpoint at TP 2 (by reshard's megatron-torch-dist writer, whose bytes
// megatron_torch_dist_tp2_from_megatron_llama pins), in `dir`/torch-dist.
std::string WriteTorchDistLlamaInput(const std::string& dir) {
  ConversionSpec spec;
  spec.kind = ConversionSpec::Kind::kReshard;
  spec.input = WriteMegatronLlamaInput(dir);
  spec.output = dir + "/torch-dist";
  spec.output_format = "megatron-torch-dist";
  spec.parts = 2;
  absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
  if (!result.ok()) {
    ADD_FAILURE() << "writing the torch_dist input: " << result.status();
    return "";
  }
  return spec.output;
}

std::vector<GoldenConversion> Conversions() {
  const auto st = RegisteredFixtureInput("safetensors", "single-file");
  const auto megatron = RegisteredFixtureInput("megatron");
  // The tied fixture: lm_head.weight shares embed.weight's storage.
  const auto tied = RegisteredFixtureInput("deepspeed-zero", "no-zero");
  // Mixture-of-experts at TP 2 x EP 2, its experts laid out over 2 EP ranks again.
  const auto torch_dist_moe = RegisteredFixtureInput("megatron-torch-dist", "moe");
  const auto expert_parts2 = [](ConversionSpec& spec) { spec.expert_parts = 2; };
  // 48 + 6 + 16 bytes of tensors: at most 50 bytes per file gives two shards.
  const auto small_shards = [](ConversionSpec& spec) { spec.max_shard_size = 50; };
  std::vector<GoldenConversion> conversions = {
      {"safetensors_single", st, Consolidate("safetensors")},
      {"safetensors_sharded", st, With(Consolidate("safetensors"), small_shards)},
      {"safetensors_bf16", WriteRoundingInput,
       With(Consolidate("safetensors"), [](ConversionSpec& s) { s.dtype = DTypePolicy::kBF16; })},
      {"safetensors_fp16", WriteRoundingInput,
       With(Consolidate("safetensors"), [](ConversionSpec& s) { s.dtype = DTypePolicy::kF16; })},
      {"safetensors_tied_aliased", tied, Consolidate("safetensors")},
      {"safetensors_tied_duplicated", tied,
       With(Consolidate("safetensors"), [](ConversionSpec& s) { s.duplicate_tied = true; })},
      {"safetensors_parts2", megatron, Reshard("safetensors", 2)},
      {"torch_single", st, Consolidate("torch")},
      {"torch_sharded", st, With(Consolidate("torch"), small_shards)},
      {"torch_parts2", megatron, Reshard("torch", 2)},
      {"olmo_safetensors", st, Consolidate("olmo-safetensors")},
      {"torch_dcp_consolidated", st, Consolidate("torch-dcp")},
      {"torch_dcp_parts2", megatron, Reshard("torch-dcp", 2)},
      {"torch_dcp_parts3", st, Reshard("torch-dcp", 3, kThreeWayRules)},
      {"megatron_tp2_pp2", megatron,
       With(Reshard("megatron", 2), [](ConversionSpec& s) { s.pipeline_parts = 2; })},
      {"deepspeed_universal_from_zero2",
       [](const std::string& dir) { return WriteZeroFolderWithMoments(dir); },
       With(Consolidate("deepspeed-universal"),
            [](ConversionSpec& s) {
              s.read.include_optimizer = true;
              s.update_latest = true;  // latest_universal beside the output
            })},
      {"safetensors_sharded_partitioned2", st, With(Consolidate("safetensors"), small_shards),
       /*partitions=*/2},
      {"torch_dcp_parts3_partitioned3", st, Reshard("torch-dcp", 3, kThreeWayRules),
       /*partitions=*/3},
      {"safetensors_sharded_to_s3", st, With(Consolidate("safetensors"), small_shards), 0,
       /*to_s3=*/true},
      {"torch_single_to_s3", st, Consolidate("torch"), 0, /*to_s3=*/true},
      {"torch_dcp_parts3_to_s3", st, Reshard("torch-dcp", 3, kThreeWayRules), 0,
       /*to_s3=*/true},
      {"megatron_tp2_pp2_to_s3", megatron,
       With(Reshard("megatron", 2), [](ConversionSpec& s) { s.pipeline_parts = 2; }), 0,
       /*to_s3=*/true},
      {"megatron_tp2_from_hf_mixtral", WriteHfMixtralInput, Reshard("megatron", 2)},
      {"megatron_torch_dist_tp2", megatron, Reshard("megatron-torch-dist", 2)},
      {"megatron_torch_dist_tp2_from_megatron_llama", WriteMegatronLlamaInput,
       Reshard("megatron-torch-dist", 2)},
      {"hf_from_megatron_llama_tp2_pp2", WriteMegatronLlamaInput,
       With(Consolidate("hf"), HfConfigOverrides)},
      {"hf_from_torch_dist_llama", WriteTorchDistLlamaInput, Consolidate("hf")},
      {"hf_from_megatron_qwen2_tied_tp2",
       [](const std::string& dir) { return WriteMegatronLlamaSave(dir, kQwen2, 2, 1); },
       Consolidate("hf")},
      {"megatron_tp2_from_hf_llama",
       [](const std::string& dir) { return WriteHfLlamaFolder(dir, kLlama); },
       Reshard("megatron", 2)},
      {"megatron_torch_dist_tp2_from_hf_llama",
       [](const std::string& dir) { return WriteHfLlamaFolder(dir, kLlama); },
       Reshard("megatron-torch-dist", 2)},
      {"safetensors_from_deepspeed_moe_zero2_with_moments",
       [](const std::string& dir) { return WriteMoeZeroFolder(dir, /*moments=*/true).input; },
       With(Consolidate("safetensors"),
            [](ConversionSpec& s) { s.read.include_optimizer = true; })},
      {"megatron_tp2_ep2_from_torch_dist_moe", torch_dist_moe,
       With(Reshard("megatron", 2), expert_parts2)},
      {"megatron_torch_dist_tp2_ep2_from_torch_dist_moe", torch_dist_moe,
       With(Reshard("megatron-torch-dist", 2), expert_parts2)},
  };
  for (const auto& [key, fixture] : FormatFixtures()) {
    conversions.push_back({absl::StrCat("consolidate_", FixtureTestName(key)),
                           RegisteredFixtureInput(key.first, key.second),
                           Consolidate("safetensors")});
  }
  return conversions;
}

std::string Hex(uint64_t value) { return absl::StrFormat("%016x", value); }

// The manifest without the fields that differ between runs of the same conversion.
std::string StableManifest(const std::string& text) {
  nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    ADD_FAILURE() << "the manifest is not a JSON object: " << text;
    return text;
  }
  for (const char* field : {"created_unix", "version", "job_id", "split_id"}) {
    manifest.erase(field);
  }
  if (manifest.contains("source") && manifest["source"].is_object()) {
    manifest["source"].erase("path");
  }
  // The paths of the files the request names beside the input (--config, --tokenizer).
  if (manifest.contains("request") && manifest["request"].is_object()) {
    for (const char* field : {"hf_config_file", "tokenizer"}) {
      manifest["request"].erase(field);
    }
  }
  return manifest.dump(2);
}

// Every file under the folder `output`: its path relative to `output` -> its bytes.
std::map<std::string, std::string> FilesIn(const std::string& output) {
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(output)) {
    if (!entry.is_regular_file()) continue;
    files[fs::relative(entry.path(), output).string()] = ReadAll(entry.path().string());
  }
  return files;
}

// "<id> <file> <bytes> <xxh3>" for every file of an output (name -> bytes), sorted by name.
std::vector<std::string> Describe(const std::string& id,
                                  const std::map<std::string, std::string>& files) {
  std::vector<std::string> lines;
  for (const auto& [file, contents] : files) {
    const std::string bytes = file == kManifestName ? StableManifest(contents) : contents;
    lines.push_back(absl::StrCat(id, " ", file, " ", bytes.size(), " ",
                                 Hex(XXH3_64bits(bytes.data(), bytes.size()))));
  }
  return lines;
}

// How a run executes; none of it may change the bytes written.
struct Execution {
  std::string name;
  int threads = 2;
  uint64_t window_bytes = 32ull << 20;
  IoMode io = IoMode::kAuto;
};

// Runs `conversion` on a fresh copy of its input in the empty folder `dir`; the lines of its
// output, empty on failure.
std::vector<std::string> ConvertIn(const GoldenConversion& conversion, const Execution& execution,
                                   const std::string& dir) {
  fs::create_directories(dir + "/in");
  ConversionSpec spec;
  spec.input = conversion.input(dir + "/in");
  spec.output = dir + "/out";
  spec.threads = execution.threads;
  spec.window_bytes = execution.window_bytes;
  spec.io = execution.io;
  conversion.configure(spec);
  if (spec.input.empty()) return {};
  if (conversion.to_s3) {
    MemoryS3Client s3;
    const std::string bucket = "golden";
    const std::string prefix = absl::StrCat(conversion.id, "-", execution.name, "/out/");
    EXPECT_TRUE(s3.CreateBucket(bucket).ok());
    spec.output = absl::StrCat("s3://", bucket, "/", prefix);
    spec.output.pop_back();
    absl::StatusOr<ConversionResult> result = RunConversionToObjectStore(spec, {}, S3Store(&s3));
    if (!result.ok()) {
      ADD_FAILURE() << "conversion " << conversion.id << " (" << execution.name
                    << "): " << result.status();
      return {};
    }
    std::map<std::string, std::string> objects;
    for (const auto& [key, bytes] : s3.objects(bucket)) {
      if (absl::StartsWith(key, prefix)) objects[key.substr(prefix.size())] = bytes;
    }
    return Describe(conversion.id, objects);
  }
  for (int worker = 0; worker < std::max(conversion.partitions, 1); ++worker) {
    spec.partition_index = worker;
    spec.partition_count = conversion.partitions;
    absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
    if (!result.ok()) {
      ADD_FAILURE() << "conversion " << conversion.id << " (" << execution.name << ", worker "
                    << worker << "): " << result.status();
      return {};
    }
  }
  // The output, and what the format writes beside it (update_latest), as "../<name>".
  std::map<std::string, std::string> files = FilesIn(spec.output);
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    files["../" + entry.path().filename().string()] = ReadAll(entry.path().string());
  }
  return Describe(conversion.id, files);
}

// ConvertIn in a new temporary folder, removed afterwards unless the conversion failed (then
// the failure names it), so that runs outside `bazel test` leave nothing behind.
std::vector<std::string> Convert(const GoldenConversion& conversion, const Execution& execution) {
  const std::string dir = MakeTempDir(absl::StrCat(conversion.id, "_", execution.name));
  std::vector<std::string> lines = ConvertIn(conversion, execution, dir);
  if (lines.empty()) {
    ADD_FAILURE() << "conversion " << conversion.id << " (" << execution.name
                  << "): its input and output are kept in " << dir;
  } else {
    std::error_code error;
    fs::remove_all(dir, error);
  }
  return lines;
}

// The expected file's lines, by conversion id; comments and blank lines skipped.
std::map<std::string, std::vector<std::string>> ReadExpected(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::map<std::string, std::vector<std::string>> expected;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    expected[line.substr(0, line.find(' '))].push_back(line);
  }
  return expected;
}

void WriteExpected(const std::string& path,
                   const std::map<std::string, std::vector<std::string>>& actual) {
  std::ostringstream out;
  out << "# Golden outputs of //lib/engine:golden_outputs_test (see golden_outputs_test.cc).\n"
      << "# <conversion> <file> <bytes> <xxh3-64>; regenerate with:\n# " << kUpdateCommand << "\n";
  for (const auto& [id, lines] : actual) {
    for (const std::string& line : lines) out << line << "\n";
  }
  std::ofstream file(path, std::ios::trunc);
  file << out.str();
  ASSERT_TRUE(file.good()) << "cannot write " << path;
}

TEST(GoldenOutputsTest, EveryConversionGivesTheRecordedBytes) {
  std::map<std::string, std::vector<std::string>> actual;
  for (const GoldenConversion& conversion : Conversions()) {
    SCOPED_TRACE(conversion.id);
    const std::vector<std::string> first = Convert(conversion, {"a"});
    const std::vector<std::string> second =
        Convert(conversion, {"b", /*threads=*/1, kMinWindowBytes, IoMode::kBuffered});
    ASSERT_FALSE(first.empty()) << "conversion " << conversion.id << " wrote nothing";
    ASSERT_EQ(first, second) << "conversion " << conversion.id
                             << " is not deterministic: two runs on the same input, in "
                                "different folders, with 2 and 1 threads, wrote different bytes";
    ASSERT_TRUE(actual.emplace(conversion.id, first).second)
        << "two conversions named " << conversion.id;
  }

  if (const char* update = std::getenv(kUpdateEnv); update != nullptr && *update != '\0') {
    WriteExpected(update, actual);
    std::fprintf(stderr, "golden outputs: wrote %s (%zu conversions)\n", update, actual.size());
    return;
  }

  const std::map<std::string, std::vector<std::string>> expected = ReadExpected(kExpectedFile);
  for (const auto& [id, lines] : actual) {
    const auto it = expected.find(id);
    if (it == expected.end()) {
      ADD_FAILURE() << "conversion " << id << " has no expected outputs in " << kExpectedFile
                    << "; if it is new, record them with: " << kUpdateCommand;
      continue;
    }
    if (it->second == lines) continue;
    std::map<std::string, std::string> want, got;  // file -> "<bytes> <xxh3>"
    for (const std::string& line : it->second) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f.size() == 4) want[f[1]] = absl::StrCat(f[2], " bytes, xxh3 ", f[3]);
    }
    for (const std::string& line : lines) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      got[f[1]] = absl::StrCat(f[2], " bytes, xxh3 ", f[3]);
    }
    std::string diff;
    for (const auto& [file, value] : want) {
      const auto g = got.find(file);
      if (g == got.end()) {
        absl::StrAppend(&diff, "\n  ", file, ": expected ", value, ", not written");
      } else if (g->second != value) {
        absl::StrAppend(&diff, "\n  ", file, ": expected ", value, ", got ", g->second);
      }
    }
    for (const auto& [file, value] : got) {
      if (want.count(file) == 0)
        absl::StrAppend(&diff, "\n  ", file, ": not expected, got ", value);
    }
    ADD_FAILURE() << "conversion " << id << ": output differs from " << kExpectedFile << diff
                  << "\nIf the format change is intended, regenerate the file in the same "
                     "commit with: "
                  << kUpdateCommand;
  }
  for (const auto& [id, lines] : expected) {
    if (actual.count(id) == 0) {
      ADD_FAILURE() << kExpectedFile << " lists conversion " << id
                    << ", which the test no longer runs; regenerate with: " << kUpdateCommand;
    }
  }
}

}  // namespace
}  // namespace reshard
