// The format conformance suite, in the manner of tensorstore's driver test suites
// (driver_testutil.h, kvstore/test_util.h): the same checks for every registered input format,
// on each small checkpoint its fixture builders write (lib/formats/format_fixture.h; a format
// may have several, one per layout variant, and must have one):
//
//   1. detection picks exactly that format;
//   2. the model reads (LoadInput), its Catalog validates, and its values are the ones the
//      fixture holds (verify against a safetensors file written without the reader);
//   3. the model converts through every registered output writer, into a local folder and
//      into the memory kvstore driver (mem://, standing in for S3), and `verify` finds input
//      and output equal, exactly (deepspeed-universal, which needs Adam moments no registered
//      fixture holds, from a ZeRO save with moments);
//   4. truncated and bit-flipped variants (and a missing file, where the format has several,
//      or a file of another save) fail with one exact code, DATA_LOSS or INVALID_ARGUMENT
//      (NOT_FOUND for a missing file), naming the file where the fixture says so: never a crash,
//      never OK with different data. torch.save storage records carry CRC-32s, so a flipped
//      data byte of the torch.save-based formats fails DATA_LOSS when converting. safetensors
//      keeps no checksum: a flipped data byte cannot be noticed there; the suite checks that
//      the conversion then carries the changed value and `verify` reports the difference.
//
// It prints "conformance: <format> ok" (or FAILED) for each format it ran.

#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/engine/conversion.h"
#include "lib/engine/partitioned_conversion.h"
#include "lib/engine/verify.h"
#include "lib/formats/format.h"
#include "lib/formats/deepspeed/moe_fixture.h"
#include "lib/formats/deepspeed/zero_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/megatron/megatron_core_names.h"
#include "lib/formats/safetensors/safetensors_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/io/kvstore/driver.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/hf_megatron_fixture.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;

// Which formats ran and whether all their cases passed; printed when the suite ends.
class Report : public ::testing::Environment {
 public:
  static Report* Get() {
    static Report* report = new Report;
    return report;
  }
  void Record(const std::string& format, bool failed) { failed_[format] |= failed; }
  void TearDown() override {
    for (const auto& [format, failed] : failed_) {
      std::fprintf(stderr, "conformance: %s %s\n", format.c_str(), failed ? "FAILED" : "ok");
    }
  }

 private:
  std::map<std::string, bool> failed_;
};

const ::testing::Environment* const report_environment =
    ::testing::AddGlobalTestEnvironment(Report::Get());

// A registered fixture: (format id, variant).
using FixtureKey = std::pair<std::string, std::string>;

// Every fixture of every registered input format; (id, "") for a format without one, so that
// the suite fails for it.
std::vector<FixtureKey> FixtureKeys() {
  std::vector<FixtureKey> keys;
  for (const std::string& id : InputFormatIds()) {
    const size_t before = keys.size();
    for (const auto& [key, fixture] : FormatFixtures()) {
      if (key.first == id) keys.push_back(key);
    }
    if (keys.size() == before) keys.emplace_back(id, "");
  }
  return keys;
}

TEST(FormatFixtureRegistryTest, EveryInputFormatHasAFixtureAndNoFixtureIsStray) {
  const std::vector<std::string> inputs = InputFormatIds();
  ASSERT_FALSE(inputs.empty());
  const std::set<std::string> registered(inputs.begin(), inputs.end());
  std::set<std::string> with_fixture;
  for (const auto& [key, fixture] : FormatFixtures()) {
    ASSERT_EQ(registered.count(key.first), 1u)
        << "fixture for unknown input format \"" << key.first << "\"";
    with_fixture.insert(key.first);
  }
  for (const std::string& id : inputs) {
    ASSERT_EQ(with_fixture.count(id), 1u)
        << "input format \"" << id << "\" has no conformance fixture: register one with "
        << "FormatFixtureRegistration in lib/formats/<format>/<format>_fixture.cc";
  }
  ASSERT_FALSE(OutputFormatIds().empty());
}

class ConformanceTest : public ::testing::TestWithParam<FixtureKey> {
 protected:
  void SetUp() override {
    format_ = GetParam().first;
    label_ = GetParam().second.empty() ? format_ : absl::StrCat(format_, "/", GetParam().second);
    const auto it = FormatFixtures().find(GetParam());
    ASSERT_NE(it, FormatFixtures().end()) << "no fixture for " << format_;
    dir_ = MakeTempDir(absl::StrCat("fixture_", Tag()));
    fixture_ = it->second.builder(dir_);
    ASSERT_FALSE(fixture_.input.empty()) << "the fixture " << label_ << " was not built";
  }
  void TearDown() override { Report::Get()->Record(format_, HasFailure()); }

  // The fixture's input path inside a copy of its folder at `copy`.
  std::string InputIn(const std::string& copy) const {
    return copy + fixture_.input.substr(dir_.size());
  }
  // The label in a file name.
  std::string Tag() const { return absl::StrReplaceAll(label_, {{"/", "_"}}); }

  std::string format_;  // the format id
  std::string label_;   // "<format id>[/<variant>]", for messages
  std::string dir_;
  BuiltFixture fixture_;
};

ConversionSpec Spec(const std::string& input, const std::string& output,
                    const std::string& output_format) {
  ConversionSpec spec;
  spec.kind = ConversionSpec::Kind::kConsolidate;
  spec.input = input;
  spec.output = output;
  spec.output_format = output_format;
  spec.threads = 1;
  return spec;
}

TEST_P(ConformanceTest, DetectionPicksExactlyThisFormat) {
  absl::StatusOr<const InputFormat*> format = DetectInputFormat(fixture_.input);
  ASSERT_TRUE(format.ok()) << format.status();
  ASSERT_EQ((*format)->id(), format_);
}

TEST_P(ConformanceTest, ReadsAndTheCatalogValidates) {
  absl::StatusOr<LoadedInput> loaded = LoadInput(fixture_.input, {}, /*require_model=*/true);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->model.format, format_);
  ASSERT_TRUE(loaded->merged);
  ASSERT_FALSE(loaded->model.parts.empty());
  for (const Catalog& part : loaded->model.parts) {
    const absl::Status status = ValidateCatalog(part);
    ASSERT_TRUE(status.ok()) << status;
  }
  const absl::Status status = ValidateCatalog(loaded->catalog);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(loaded->catalog.tensors.size(), fixture_.expected.size());
}

// Verify of `checkpoint` against a safetensors file of `expected`: equal, every tensor compared,
// none missing or extra. `tag` names the temporary folder.
void ExpectHolds(const std::string& checkpoint, const std::vector<FixtureTensor>& expected,
                 const std::string& tag) {
  const std::string reference = MakeTempDir(absl::StrCat("expected_", tag)) + "/x.safetensors";
  WriteAll(reference, SafetensorsFileOf(expected));
  absl::StatusOr<VerifyResult> verify = VerifyCheckpoints(reference, checkpoint);
  ASSERT_TRUE(verify.ok()) << verify.status();
  ASSERT_TRUE(verify->only_in_a.empty())
      << "missing from " << checkpoint << ": " << verify->only_in_a[0];
  ASSERT_TRUE(verify->only_in_b.empty()) << "not expected: " << verify->only_in_b[0];
  ASSERT_TRUE(verify->mismatched.empty())
      << verify->mismatched[0].name << ": " << verify->mismatched[0].reason;
  ASSERT_TRUE(verify->equal);
  ASSERT_EQ(verify->tensors_compared, static_cast<int64_t>(expected.size()));
}

// What the reader gives is what the fixture holds: verify against a safetensors file of the
// expected tensors, written independently of the reader.
TEST_P(ConformanceTest, ReadsTheValuesTheFixtureHolds) {
  ASSERT_FALSE(fixture_.expected.empty());
  ExpectHolds(fixture_.input, fixture_.expected, Tag());
}

// Writers of training checkpoints that take input of their own framework only (they carry its
// args and iteration, or its optimizer state): writer -> the input formats it writes from.
// Other inputs are refused. deepspeed-universal needs the Adam moments, which no registered
// fixture holds: the writer suite below runs it from a ZeRO save with moments
// (WriteZeroFolderWithMoments). hf needs a whole Megatron decoder of a known family to rename and
// split, which no registered fixture is: the hf suite below runs it from Megatron-LM saves of
// Llama, Mistral, Qwen2, Qwen3 and GPT-2 models (lib/testing/hf_megatron_fixture.h).
const std::map<std::string, std::set<std::string>>& FrameworkWriters() {
  static const auto* writers = new std::map<std::string, std::set<std::string>>{
      {"megatron", {"megatron", "megatron-torch-dist"}},
      {"megatron-torch-dist", {"megatron", "megatron-torch-dist"}},
      {"deepspeed-universal", {}},
      {"hf", {}}};
  return *writers;
}

// Writers that write the tensors under another framework's names: writer -> the name the
// output's reader gives back to an input tensor. megatron-torch-dist writes Megatron-Core keys,
// a layer's tensors stacked under one key (so it writes fewer tensors than it reads).
using Renaming = std::function<std::string(const std::string&)>;
const std::map<std::string, Renaming>& RenamingWriters() {
  static const auto* writers = new std::map<std::string, Renaming>{
      {"megatron-torch-dist", [](const std::string& name) {
         absl::StatusOr<MegatronCoreTensor> core =
             MegatronCoreName(name, MegatronCoreSpec::kTransformerEngine);
         return core.ok() ? core->UnstackedName() : name;
       }}};
  return *writers;
}

// Fixtures a writer refuses for a limit of its own rather than for their framework: (writer,
// fixture tag "<format id>[_<variant>]") -> the one code it refuses with. deepspeed-universal
// carries a ZeRO save's training state, which a DeepSpeed mixture-of-experts ZeRO save's reader
// does not give (per-group steps and settings, moe_zero_reader.cc); megatron writes a GPT's
// tensors under Megatron-LM's names, and the torch_dist fixture's layer tensor is no GPT's.
const std::map<std::pair<std::string, std::string>, absl::StatusCode>& RefusingWriters() {
  static const auto* writers = new std::map<std::pair<std::string, std::string>, absl::StatusCode>{
      {{"deepspeed-universal", "deepspeed-zero_moe-zero2"}, absl::StatusCode::kUnimplemented},
      {{"megatron", "megatron-torch-dist"}, absl::StatusCode::kInvalidArgument}};
  return *writers;
}

// Whether anything is at `output` (a local path or a mem:// URL).
bool OutputExists(const std::string& output) {
  if (!absl::StartsWith(output, "mem://")) return fs::exists(output);
  absl::StatusOr<kvstore::Listing> listing = kvstore::GetMemoryDriver().List(output);
  return !listing.ok() || !listing->files.empty() || !listing->folders.empty();
}

// Outputs the readers cannot take from object storage because the input lacks what would say
// their layout: (writer, fixture tag). The Megatron writer keeps the input's args, and the
// Megatron fixture's have no tensor_model_parallel_size and pipeline_model_parallel_size, which
// the Megatron reader needs on storage without folders (a missing rank leaves no folder behind
// there). Such an output is read back from a local copy of its files.
const std::set<std::pair<std::string, std::string>>& ReadBackLocally() {
  static const auto* outputs = new std::set<std::pair<std::string, std::string>>{
      {"megatron", "megatron"}};
  return *outputs;
}

// The bytes of the file at `path` (a local path or a mem:// URL); empty, and a failure, when it
// cannot be read.
std::string OutputFile(const std::string& path) {
  if (!absl::StartsWith(path, "mem://")) return ReadAll(path);
  absl::StatusOr<kvstore::PathStat> stat = kvstore::GetMemoryDriver().Stat(path);
  EXPECT_TRUE(stat.ok()) << stat.status();
  if (!stat.ok()) return "";
  std::string bytes(stat->size, '\0');
  const absl::Status read =
      kvstore::GetMemoryDriver().ReadRange(path, 0, absl::MakeSpan(bytes), *stat);
  EXPECT_TRUE(read.ok()) << read;
  return read.ok() ? bytes : "";
}

// Copies every file under mem:// folder `url` into local folder `dir`.
void Download(const std::string& url, const std::string& dir) {
  absl::StatusOr<kvstore::Listing> listing = kvstore::GetMemoryDriver().List(url);
  ASSERT_TRUE(listing.ok()) << listing.status();
  fs::create_directories(dir);
  for (const kvstore::FileEntry& file : listing->files) {
    WriteAll(absl::StrCat(dir, "/", file.name), OutputFile(absl::StrCat(url, "/", file.name)));
  }
  for (const std::string& folder : listing->folders) {
    ASSERT_NO_FATAL_FAILURE(Download(absl::StrCat(url, "/", folder), absl::StrCat(dir, "/", folder)));
  }
}

// Checks that `output`, which `writer` wrote from `input` (holding the `expected` tensors),
// reads back through the readers equal to the input (under the names a renaming writer gives
// them), exactly. `tag`, the fixture's, names temporary folders.
void ExpectWrittenExactly(const std::string& input, const std::string& writer,
                          const std::string& output, const std::vector<FixtureTensor>& expected,
                          const std::string& tag) {
  const int64_t tensors = static_cast<int64_t>(expected.size());
  std::string read_back = output;
  if (absl::StartsWith(output, "mem://") && ReadBackLocally().count({writer, tag}) > 0) {
    absl::StatusOr<LoadedInput> remote = LoadInput(output, {}, /*require_model=*/true);
    ASSERT_EQ(remote.status().code(), absl::StatusCode::kInvalidArgument) << remote.status();
    read_back = MakeTempDir(absl::StrCat("read_back_", writer)) + "/out";
    ASSERT_NO_FATAL_FAILURE(Download(output, read_back));
  }
  std::string reference = input;
  if (auto renaming = RenamingWriters().find(writer); renaming != RenamingWriters().end()) {
    // The output against the fixture's tensors under the names it gives them.
    std::vector<FixtureTensor> renamed = expected;
    for (FixtureTensor& tensor : renamed) tensor.name = renaming->second(tensor.name);
    reference = MakeTempDir(absl::StrCat("renamed_", tag, "_", writer)) + "/x.safetensors";
    WriteAll(reference, SafetensorsFileOf(renamed));
  }
  absl::StatusOr<VerifyResult> verify = VerifyCheckpoints(reference, read_back);
  ASSERT_TRUE(verify.ok()) << verify.status();
  ASSERT_TRUE(verify->equal) << "verify finds the " << writer << " output different";
  ASSERT_EQ(verify->tensors_compared, tensors);
  ASSERT_TRUE(verify->mismatched.empty());
  ASSERT_TRUE(verify->only_in_a.empty());
  ASSERT_TRUE(verify->only_in_b.empty());
}

// Converts `input` (of format `format`, holding the `expected` tensors) through every registered
// writer into `output_of(writer)`, and checks that verify, reading the output back through the
// readers, finds it equal to the input (under the names a renaming writer gives them), exactly;
// writers of another framework (and RefusingWriters) refuse it and leave nothing at the output.
// `tag`, the fixture's, names temporary folders.
void RoundTripThroughEveryWriter(const std::string& input, const std::string& format,
                                 const std::vector<FixtureTensor>& expected,
                                 const std::string& tag,
                                 const std::function<std::string(const std::string&)>& output_of) {
  const std::vector<std::string> writers = OutputFormatIds();
  ASSERT_FALSE(writers.empty());
  for (const std::string& writer : writers) {
    SCOPED_TRACE(writer);
    const std::string output = output_of(writer);
    // The CLI's and the daemon's entry point: mem:// outputs go through the object store commit.
    absl::StatusOr<ConversionResult> result = RunAnyConversion(Spec(input, output, writer));
    if (auto it = RefusingWriters().find({writer, tag}); it != RefusingWriters().end()) {
      ASSERT_EQ(result.status().code(), it->second) << result.status();
      ASSERT_FALSE(OutputExists(output));
      continue;
    }
    if (auto it = FrameworkWriters().find(writer);
        it != FrameworkWriters().end() && it->second.count(format) == 0) {
      // InvalidArgument (another framework's input), FailedPrecondition (no optimizer state).
      ASSERT_TRUE(result.status().code() == absl::StatusCode::kInvalidArgument ||
                  result.status().code() == absl::StatusCode::kFailedPrecondition)
          << result.status();
      ASSERT_FALSE(OutputExists(output));
      continue;
    }
    ASSERT_TRUE(result.ok()) << result.status();
    if (RenamingWriters().count(writer) == 0) {
      ASSERT_EQ(result->tensors, static_cast<int64_t>(expected.size()));
    }
    ASSERT_NO_FATAL_FAILURE(ExpectWrittenExactly(input, writer, output, expected, tag));
  }
}

TEST_P(ConformanceTest, RoundTripsThroughEveryWriterExactly) {
  RoundTripThroughEveryWriter(
      fixture_.input, format_, fixture_.expected, Tag(),
      [this](const std::string& writer) {
        return MakeTempDir(absl::StrCat("out_", Tag(), "_", writer)) + "/out";
      });
}

// The same with every output written to the memory driver (standing in for S3), read back
// from there.
TEST_P(ConformanceTest, RoundTripsThroughEveryWriterIntoMemoryExactly) {
  RoundTripThroughEveryWriter(fixture_.input, format_, fixture_.expected, Tag(),
                              [this](const std::string& writer) {
                                return absl::StrCat("mem://conformance/", Tag(), "/", writer);
                              });
}

// The writers that lay a mixture-of-experts model's experts over expert-parallel ranks
// (--parts 2 --expert-parts 2), from the torch_dist MoE fixture (TP 2 x EP 2), into a local
// folder and into memory: each output reads back equal to the fixture's tensors.
TEST(ExpertParallelWriterConformanceTest, WritesTp2Ep2AndReadsBackExactly) {
  const auto fixture = FormatFixtures().find({"megatron-torch-dist", "moe"});
  ASSERT_NE(fixture, FormatFixtures().end());
  const BuiltFixture built = fixture->second.builder(MakeTempDir("expert_parallel_input"));
  for (const std::string writer : {"megatron", "megatron-torch-dist"}) {
    for (const std::string output :
         {MakeTempDir(absl::StrCat("expert_parallel_", writer)) + "/out",
          absl::StrCat("mem://conformance/expert_parallel/", writer)}) {
      SCOPED_TRACE(output);
      ConversionSpec spec = Spec(built.input, output, writer);
      spec.kind = ConversionSpec::Kind::kReshard;
      spec.parts = 2;
      spec.expert_parts = 2;
      absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_NO_FATAL_FAILURE(
          ExpectWrittenExactly(built.input, writer, output, built.expected, "expert_parallel"));
    }
  }
}

// Megatron-LM names EP rank folders mp_rank_TT_EEE at PP 1, which only the args tell from
// pipeline stages: from an input whose common.pt has no args, --expert-parts 2 is refused
// before anything is written, naming the input and the args it lacks.
TEST(ExpertParallelWriterConformanceTest, MegatronAtEp2WithoutArgsIsRefused) {
  const auto fixture = FormatFixtures().find({"megatron-torch-dist", "moe"});
  ASSERT_NE(fixture, FormatFixtures().end());
  const BuiltFixture built = fixture->second.builder(MakeTempDir("expert_parallel_no_args"));
  PickleWriter common;  // common.pt without its args
  common.BeginDict(false);
  common.String("checkpoint_version");
  common.Float(3.0);
  common.String("iteration");
  common.Int(10);
  common.EndDict();
  WriteAll(built.input + "/iter_0000010/common.pt", BuildTorchSave(common.Finish(), {}).bytes);
  const std::string output = MakeTempDir("expert_parallel_no_args_out") + "/out";
  ConversionSpec spec = Spec(built.input, output, "megatron");
  spec.kind = ConversionSpec::Kind::kReshard;
  spec.parts = 2;
  spec.expert_parts = 2;
  absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "expert_model_parallel_size"))
      << result.status();
  EXPECT_FALSE(OutputExists(output));
}

// The names of `catalog`'s tensors, sorted.
std::vector<std::string> TensorNames(const Catalog& catalog) {
  std::vector<std::string> names;
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  std::sort(names.begin(), names.end());
  return names;
}

// deepspeed-universal, which no registered fixture can feed (FrameworkWriters), from a ZeRO-2
// save folder whose optimizer files hold the Adam moments, into a local folder and into
// memory: verify, reading both sides with their optimizer state, finds the model and the
// moments equal to the input's.
TEST(UniversalWriterConformanceTest, RoundTripsFromZeroWithMomentsExactly) {
  const std::string input = WriteZeroFolderWithMoments(MakeTempDir("universal_input"));
  VerifyOptions with_moments;
  with_moments.read.include_optimizer = true;
  absl::StatusOr<LoadedInput> model = LoadInput(input, {}, /*require_model=*/true);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<LoadedInput> state =
      LoadInput(input, {}, /*require_model=*/true, with_moments.read);
  ASSERT_TRUE(state.ok()) << state.status();
  // The model's tensors and the two moments of each trainable one.
  ASSERT_GT(state->catalog.tensors.size(), model->catalog.tensors.size());
  for (const std::string& output : {MakeTempDir("universal_output") + "/out",
                                    std::string("mem://conformance/universal/out")}) {
    SCOPED_TRACE(output);
    ConversionSpec spec = Spec(input, output, "deepspeed-universal");
    spec.read = with_moments.read;
    absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
    ASSERT_TRUE(result.ok()) << result.status();
    absl::StatusOr<VerifyResult> verify = VerifyCheckpoints(input, output, with_moments);
    ASSERT_TRUE(verify.ok()) << verify.status();
    ASSERT_TRUE(verify->equal) << "verify finds the deepspeed-universal output different";
    ASSERT_EQ(verify->tensors_compared, static_cast<int64_t>(state->catalog.tensors.size()));
    ASSERT_TRUE(verify->mismatched.empty());
    ASSERT_TRUE(verify->only_in_a.empty());
    ASSERT_TRUE(verify->only_in_b.empty());
  }
}

struct HfExportCase {
  std::string name;
  HfLlamaModel model;
  int tp = 1;
  int pp = 1;
};

// The Hugging Face export cases: Llama with 4 query heads in 2 groups, untied, at TP 2 x PP 2;
// Qwen2 (a QKV bias) with 4 heads in 4 groups, tied, at TP 2; GPT-2 (4 heads, Conv1D weights,
// learned positions, LayerNorm biases), tied, at TP 2 x PP 2; Qwen3 (q/k norms, head_dim 4 where
// hidden / heads is 2), untied, at TP 2 x PP 2; Mistral (a sliding window of 4), untied, at TP 2.
std::vector<HfExportCase> HfExportCases() {
  HfExportCase llama{"llama_gqa_tp2_pp2", {}, 2, 2};
  HfExportCase qwen2{"qwen2_bias_tied_tp2", {}, 2, 1};
  qwen2.model.groups = 4;
  qwen2.model.qkv_bias = true;
  qwen2.model.tied = true;
  HfExportCase gpt2{"gpt2_tied_tp2_pp2", {}, 2, 2};
  gpt2.model.gpt2 = true;
  gpt2.model.groups = 4;
  gpt2.model.tied = true;
  HfExportCase qwen3{"qwen3_qk_norm_head_dim_tp2_pp2", {}, 2, 2};
  qwen3.model.qk_norm = true;
  qwen3.model.head_dim = 4;
  HfExportCase mistral{"mistral_sliding_window_tp2", {}, 2, 1};
  mistral.model.sliding_window = 4;
  return {llama, qwen2, gpt2, qwen3, mistral};
}

// config.json as transformers' config class of the family takes it for `model` (the keys of
// lib/formats/hf/hf_config.h, with the args the fixture saves), with the token ids of --config.
nlohmann::json ExpectedHfConfig(const HfLlamaModel& model) {
  if (model.gpt2) {
    // GPT2Config's keys, with the values transformers' convert_megatron_gpt2_checkpoint.py gives
    // them (openai_gelu: gelu_new; n_inner as the ffn is not 4 x n_embd).
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", model.vocab},
            {"n_positions", model.positions},
            {"n_embd", model.hidden},
            {"n_layer", model.layers},
            {"n_head", model.heads},
            {"n_inner", model.ffn},
            {"activation_function", "gelu_new"},
            {"resid_pdrop", 0.1},
            {"embd_pdrop", 0.1},
            {"attn_pdrop", 0.1},
            {"layer_norm_epsilon", 1e-5},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", model.tied},
            {"torch_dtype", "float32"},
            {"use_cache", true},
            {"bos_token_id", 1},
            {"eos_token_id", 2}};
  }
  const std::string family = model.family();
  const std::map<std::string, std::string> architectures = {{"llama", "LlamaForCausalLM"},
                                                             {"mistral", "MistralForCausalLM"},
                                                             {"qwen2", "Qwen2ForCausalLM"},
                                                             {"qwen3", "Qwen3ForCausalLM"}};
  nlohmann::json config = {{"architectures", {architectures.at(family)}},
                           {"model_type", family},
                           {"hidden_size", model.hidden},
                           {"intermediate_size", model.ffn},
                           {"num_hidden_layers", model.layers},
                           {"num_attention_heads", model.heads},
                           {"num_key_value_heads", model.groups},
                           {"head_dim", model.head_dim},
                           {"hidden_act", "silu"},
                           {"max_position_embeddings", model.positions},
                           {"rms_norm_eps", 1e-6},
                           {"rope_theta", 500000.0},
                           {"rope_scaling", nullptr},
                           {"vocab_size", model.vocab},
                           {"tie_word_embeddings", model.tied},
                           {"torch_dtype", "float32"},
                           {"use_cache", true},
                           {"bos_token_id", 1},
                           {"eos_token_id", 2}};
  // MistralConfig has a sliding window and no attention_bias.
  if (family == "mistral") {
    config["sliding_window"] = model.sliding_window;
  } else {
    config["attention_bias"] = model.qkv_bias;
  }
  return config;
}

// --format hf, which no registered fixture can feed (FrameworkWriters), from Megatron-LM saves
// of HfExportCases, into a local folder and into memory: every tensor equal to the Hugging Face
// tensor the save was made from (the Megatron layout is computed by the fixture, not by
// reshard's transforms), the vocabulary's padding rows left out, config.json and
// generation_config.json field by field.
TEST(HfWriterConformanceTest, MegatronSavesOfKnownFamiliesExportExactly) {
  for (const HfExportCase& c : HfExportCases()) {
    SCOPED_TRACE(c.name);
    const std::string dir = MakeTempDir(absl::StrCat("hf_export_", c.name));
    fs::create_directories(dir + "/save");
    const std::string input = WriteMegatronLlamaSave(dir + "/save", c.model, c.tp, c.pp);
    const std::string config = dir + "/config-overrides.json";
    WriteAll(config, R"({"bos_token_id": 1, "eos_token_id": 2})");
    for (const std::string& output :
         {dir + "/out", absl::StrCat("mem://conformance/hf/", c.name)}) {
      SCOPED_TRACE(output);
      ConversionSpec spec = Spec(input, output, "hf");
      spec.hf.config_file = config;
      absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_NO_FATAL_FAILURE(ExpectHolds(output, HfLlamaTensors(c.model), "hf_" + c.name));

      const nlohmann::json written = nlohmann::json::parse(OutputFile(output + "/config.json"),
                                                           nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(written.is_object()) << "config.json is not a JSON object";
      EXPECT_EQ(written, ExpectedHfConfig(c.model)) << written.dump(2);
      // JSON types as the config classes read them.
      if (c.model.gpt2) {
        EXPECT_TRUE(written["layer_norm_epsilon"].is_number_float());
        EXPECT_TRUE(written["n_head"].is_number_integer());
      } else {
        EXPECT_TRUE(written["rms_norm_eps"].is_number_float());
        EXPECT_TRUE(written["rope_theta"].is_number_float());
        EXPECT_TRUE(written["num_key_value_heads"].is_number_integer());
      }
      const nlohmann::json generation = nlohmann::json::parse(
          OutputFile(output + "/generation_config.json"), nullptr, /*allow_exceptions=*/false);
      EXPECT_EQ(generation, (nlohmann::json{{"_from_model_config", true},
                                            {"bos_token_id", 1},
                                            {"eos_token_id", 2}}));
    }
  }
}

// The import, the other way: a Hugging Face folder of each HfExportCases model (model.safetensors
// and config.json) resharded to --format megatron at TP 2, into a local folder and into memory,
// and read back by the megatron reader: the merged model is the Megatron layout the fixture
// computes (q/k/v fused per query group, [gate; up]), the vocabulary padded with zero rows to a
// multiple of make_vocab_size_divisible_by (128) x TP; each rank's file holds its TP slice
// ([gate_t; up_t], its query groups, its rows and columns).
TEST(HfWriterConformanceTest, HfFoldersImportToMegatronTp2AndReadBackExactly) {
  for (const HfExportCase& c : HfExportCases()) {
    SCOPED_TRACE(c.name);
    const std::string dir = MakeTempDir(absl::StrCat("hf_import_", c.name));
    fs::create_directories(dir + "/hf");
    const std::string input = WriteHfLlamaFolder(dir + "/hf", c.model);
    const int64_t padded_rows = 256;  // the vocabulary rounded up to 128 x TP 2
    const std::string zero_rows((padded_rows - c.model.vocab) * c.model.hidden * 4, '\0');
    for (const std::string& output :
         {dir + "/out", absl::StrCat("mem://conformance/hf-import/", c.name)}) {
      SCOPED_TRACE(output);
      ConversionSpec spec = Spec(input, output, "megatron");
      spec.kind = ConversionSpec::Kind::kReshard;
      spec.parts = 2;
      absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
      ASSERT_TRUE(result.ok()) << result.status();
      absl::StatusOr<LoadedInput> loaded = LoadInput(output, {}, /*require_model=*/true);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ASSERT_EQ(loaded->model.format, "megatron");
      ASSERT_EQ(loaded->model.parts.size(), 2u);
      ASSERT_NO_FATAL_FAILURE(ExpectHolds(output, MegatronLlamaTensors(c.model, zero_rows),
                                          "hf_import_" + c.name));
      // Each rank's file, read as the torch.save state dict it is: its own TP slice.
      for (int rank = 0; rank < 2; ++rank) {
        SCOPED_TRACE(absl::StrCat("TP rank ", rank));
        std::vector<FixtureTensor> slice = MegatronLlamaTensors(c.model, zero_rows, rank, 2);
        for (FixtureTensor& tensor : slice) tensor.name = "model." + tensor.name;
        ASSERT_NO_FATAL_FAILURE(
            ExpectHolds(absl::StrCat(output, "/release/mp_rank_0", rank, "/model_optim_rng.pt"),
                        slice, absl::StrCat("hf_import_", c.name, "_rank", rank)));
      }
    }
  }
}

// A DeepSpeed mixture-of-experts ZeRO-2 save read with --include-optimizer into the outputs
// that take the Adam moments as tensors of their own: the fp32 master weights and both moments
// of every dense and expert param (experts under their global ids), element by element against
// the fixture's known values.
TEST(MoeZeroConformanceTest, ConsolidatesTheWeightsAndAdamMomentsExactly) {
  const BuiltFixture fixture = WriteMoeZeroFolder(MakeTempDir("moe_zero_moments"), true);
  const std::string reference = MakeTempDir("moe_zero_moments_expected") + "/x.safetensors";
  WriteAll(reference, SafetensorsFileOf(fixture.expected));
  for (const std::string writer : {"safetensors", "torch"}) {
    SCOPED_TRACE(writer);
    const std::string output = MakeTempDir(absl::StrCat("moe_zero_moments_", writer)) + "/out";
    ConversionSpec spec = Spec(fixture.input, output, writer);
    spec.read.include_optimizer = true;
    absl::StatusOr<ConversionResult> result = RunAnyConversion(spec);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->tensors, static_cast<int64_t>(fixture.expected.size()));
    absl::StatusOr<VerifyResult> verify = VerifyCheckpoints(reference, output);
    ASSERT_TRUE(verify.ok()) << verify.status();
    ASSERT_TRUE(verify->mismatched.empty())
        << verify->mismatched[0].name << ": " << verify->mismatched[0].reason;
    ASSERT_TRUE(verify->only_in_a.empty()) << "missing from the output: " << verify->only_in_a[0];
    ASSERT_TRUE(verify->only_in_b.empty()) << "not expected: " << verify->only_in_b[0];
    ASSERT_TRUE(verify->equal);
    ASSERT_EQ(verify->tensors_compared, static_cast<int64_t>(fixture.expected.size()));
  }
}

void Damage(const std::string& path, const FixtureDamage& damage) {
  switch (damage.kind) {
    case FixtureDamage::Kind::kTruncate: {
      std::string bytes = ReadAll(path);
      ASSERT_LT(damage.offset, bytes.size()) << damage.label;
      bytes.resize(damage.offset);
      WriteAll(path, bytes);
      return;
    }
    case FixtureDamage::Kind::kFlip: {
      std::string bytes = ReadAll(path);
      ASSERT_LT(damage.offset, bytes.size()) << damage.label;
      bytes[damage.offset] ^= 0x01;
      WriteAll(path, bytes);
      return;
    }
    case FixtureDamage::Kind::kRemove:
      ASSERT_TRUE(fs::remove(path)) << damage.label;
      return;
    case FixtureDamage::Kind::kReplace:
      ASSERT_TRUE(fs::exists(path)) << damage.label;
      WriteAll(path, damage.replacement);
      return;
  }
}

// Reads, validates and converts `input` into `output`; the first error, else OK.
absl::Status ReadAndConvert(const std::string& input, const std::string& output) {
  absl::StatusOr<LoadedInput> loaded = LoadInput(input, {}, /*require_model=*/true);
  if (!loaded.ok()) return loaded.status();
  for (const Catalog& part : loaded->model.parts) {
    if (absl::Status status = ValidateCatalog(part); !status.ok()) return status;
  }
  if (absl::Status status = ValidateCatalog(loaded->catalog); !status.ok()) return status;
  return RunConversion(Spec(input, output, "safetensors")).status();
}

// One damaged variant, in a copy of the fixture folder at `copy`; `intact` is the fixture's input.
void CheckDamaged(const std::string& intact, const std::string& input, const std::string& copy,
                  const FixtureDamage& damage) {
  ASSERT_NO_FATAL_FAILURE(Damage(copy + "/" + damage.file, damage));
  const std::string output = copy + ".out";
  const absl::Status status = ReadAndConvert(input, output);
  if (damage.undetectable) {
    // Nothing can notice: the damaged value is carried, and verify reports it.
    ASSERT_TRUE(status.ok()) << status;
    absl::StatusOr<VerifyResult> verify = VerifyCheckpoints(intact, output);
    ASSERT_TRUE(verify.ok()) << verify.status();
    ASSERT_FALSE(verify->equal);
    ASSERT_EQ(verify->mismatched.size(), 1u);
    ASSERT_EQ(verify->mismatched[0].mismatches, 1);
    verify = VerifyCheckpoints(intact, input);
    ASSERT_TRUE(verify.ok()) << verify.status();
    ASSERT_FALSE(verify->equal);
    return;
  }
  if (status.ok()) {
    absl::StatusOr<VerifyResult> verify = VerifyCheckpoints(intact, output);
    ASSERT_TRUE(verify.ok()) << verify.status();
    FAIL() << "the damaged input was accepted; verify against the intact one finds it "
           << (verify->equal ? "equal" : "different") << " (" << verify->mismatched.size()
           << " tensors differ, " << verify->only_in_a.size() << " only in the intact one, "
           << verify->only_in_b.size() << " only in the damaged one)";
  }
  // FixtureDamage::code, else: a file the input names and does not hold is NOT_FOUND; every
  // other damage (bytes cut off or changed, in metadata or in checksummed data) is corrupt
  // data: DATA_LOSS.
  absl::StatusCode expected = damage.code;
  if (expected == absl::StatusCode::kOk) {
    expected = damage.kind == FixtureDamage::Kind::kRemove || damage.names_missing_file
                   ? absl::StatusCode::kNotFound
                   : absl::StatusCode::kDataLoss;
  }
  EXPECT_EQ(status.code(), expected) << status;
  if (!damage.named.empty()) {
    EXPECT_TRUE(absl::StrContains(status.message(), damage.named)) << status;
  }
}

TEST_P(ConformanceTest, DamagedVariantsFailCleanly) {
  ASSERT_FALSE(fixture_.damages.empty()) << "the fixture " << label_ << " lists no damages";
  int n = 0;
  for (const FixtureDamage& damage : fixture_.damages) {
    SCOPED_TRACE(damage.label);
    const std::string copy = MakeTempDir(absl::StrCat("damaged_", Tag(), "_", n++));
    fs::copy(dir_, copy, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    CheckDamaged(fixture_.input, InputIn(copy), copy, damage);
  }
}

std::string TestName(const ::testing::TestParamInfo<FixtureKey>& info) {
  return FixtureTestName(info.param);
}

INSTANTIATE_TEST_SUITE_P(RegisteredInputFormats, ConformanceTest,
                         ::testing::ValuesIn(FixtureKeys()), TestName);

}  // namespace
}  // namespace reshard
