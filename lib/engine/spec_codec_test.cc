#include "lib/engine/spec_codec.h"

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/engine/spec_codec_testing.h"
#include "lib/plan/partition_rules.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

constexpr char kRules[] = R"({"rules": [{"pattern": ".*", "replicate": true}]})";

TEST(SpecCodecTest, RequestJsonKeepsItsKeysOrderAndValues) {
  ConversionSpec spec;
  spec.kind = ConversionSpec::Kind::kReshard;
  spec.input = "/data/in/";
  spec.output = "s3://bucket/out";
  spec.dtype = DTypePolicy::kBF16;
  spec.parts = 2;
  spec.rules_json = kRules;
  spec.read.tag = "t";
  spec.threads = 7;  // not part of the request: changes no output byte
  absl::StatusOr<std::string> json = ConversionRequestJson(spec);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json,
            R"({"kind":"reshard","input":"/data/in","output":"s3://bucket/out",)"
            R"("output_format":"safetensors","dtype":"bf16","max_shard_size":5000000000,)"
            R"("parts":2,"pipeline_parts":0,"expert_parts":0,"rules_json":"{\"rules\": [{\"pattern\": \".*\", )"
            R"(\"replicate\": true}]}","duplicate_tied":false,"tag":"t",)"
            R"("include_optimizer":false,"hf_family":"","hf_config_file":"","hf_vocab_size":0,)"
            R"("update_latest":false,"no_extra_files":false,"tokenizer":"","overwrite":false})");
}

TEST(SpecCodecTest, ManifestRequestHoldsWhatTheOutputIs) {
  ConversionSpec spec;
  spec.output_format = "torch";
  spec.max_shard_size = 1000;
  spec.parts = 0;
  spec.threads = 9;
  EXPECT_EQ(SpecToManifestRequest(spec).dump(),
            R"({"kind":"consolidate","output_format":"torch","dtype":"keep",)"
            R"("max_shard_size":1000})");
  spec.kind = ConversionSpec::Kind::kReshard;
  spec.parts = 2;
  EXPECT_EQ(SpecToManifestRequest(spec).dump(),
            R"({"kind":"reshard","output_format":"torch","dtype":"keep","parts":2})");
  spec.pipeline_parts = 3;
  EXPECT_EQ(SpecToManifestRequest(spec).dump(),
            R"({"kind":"reshard","output_format":"torch","dtype":"keep","parts":2,)"
            R"("pipeline_parts":3})");
  // The model files carried: named only when they differ from a default conversion's.
  spec.no_extra_files = true;
  spec.tokenizer = "/data/tok";
  EXPECT_EQ(SpecToManifestRequest(spec).dump(),
            R"({"kind":"reshard","output_format":"torch","dtype":"keep","parts":2,)"
            R"("pipeline_parts":3,"no_extra_files":true,"tokenizer":"/data/tok"})");
  spec.no_extra_files = false;
  spec.tokenizer.clear();
  spec.expert_parts = 4;
  EXPECT_EQ(SpecToManifestRequest(spec).dump(),
            R"({"kind":"reshard","output_format":"torch","dtype":"keep","parts":2,)"
            R"("pipeline_parts":3,"expert_parts":4})");
}

TEST(SpecCodecTest, RequestJsonRoundTripsAndNamesAMissingKey) {
  const ConversionSpec spec = EverySpecFieldSet();
  absl::StatusOr<nlohmann::ordered_json> json = SpecToRequestJson(spec);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<ConversionSpec> back = SpecFromRequestJson(*json, "split.json");
  ASSERT_TRUE(back.ok()) << back.status();
  for (const SpecField& field : SpecFields()) {
    if (field.json.empty()) continue;
    EXPECT_EQ(SpecFieldText(*back, field), SpecFieldText(spec, field)) << field.name;
  }
  json->erase("tag");
  EXPECT_EQ(SpecFromRequestJson(*json, "split.json").status(),
            absl::DataLossError(R"(split.json: "request"."tag" is missing or invalid)"));
  (*json)["tag"] = 5;
  EXPECT_EQ(SpecFromRequestJson(*json, "split.json").status(),
            absl::DataLossError(R"(split.json: "request"."tag" is missing or invalid)"));
}

TEST(SpecCodecTest, NormalizeMakesPathsAbsoluteAndRulesInline) {
  const std::string dir = MakeTempDir("normalize");
  WriteAll(dir + "/rules.json", kRules);
  ConversionSpec spec;
  spec.input = dir + "/./ckpt/";
  spec.output = "s3://bucket/out/";
  spec.rules_file = dir + "/rules.json";
  spec.threads = 0;
  spec.max_shard_size = 0;
  spec.output_format = "";
  absl::StatusOr<ConversionSpec> normal = NormalizeSpec(spec);
  ASSERT_TRUE(normal.ok()) << normal.status();
  EXPECT_EQ(normal->input, dir + "/ckpt");
  EXPECT_EQ(normal->output, "s3://bucket/out/");  // a URL as given
  EXPECT_EQ(normal->rules_json, kRules);
  EXPECT_EQ(normal->rules_file, "");
  EXPECT_EQ(normal->threads, 2);
  EXPECT_EQ(normal->max_shard_size, 5'000'000'000ull);
  EXPECT_EQ(normal->output_format, "safetensors");
  absl::StatusOr<ConversionSpec> again = NormalizeSpec(*normal);
  ASSERT_TRUE(again.ok());
  for (const SpecField& field : SpecFields()) {
    EXPECT_EQ(SpecFieldText(*again, field), SpecFieldText(*normal, field)) << field.name;
  }

  const std::string cwd = fs::current_path();
  fs::current_path(dir);
  ConversionSpec relative;
  relative.input = "ckpt";
  relative.output = "a/../out/";
  normal = NormalizeSpec(relative);
  fs::current_path(cwd);
  ASSERT_TRUE(normal.ok()) << normal.status();
  EXPECT_EQ(normal->input, dir + "/ckpt");
  EXPECT_EQ(normal->output, dir + "/out");
}

TEST(SpecCodecTest, RulesFileProblemsNameTheFile) {
  const std::string dir = MakeTempDir("rules");
  ConversionSpec spec;
  spec.rules_file = dir + "/missing.json";
  absl::Status missing = NormalizeSpec(spec).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message().rfind("cannot open partition rules file " + dir + "/missing.json", 0),
            0u)
      << missing;
  WriteAll(dir + "/bad.json", R"({"rules": [{"pattern": "(", "split_dim": 0}]})");
  spec.rules_file = dir + "/bad.json";
  absl::Status bad = NormalizeSpec(spec).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(dir + "/bad.json"), std::string::npos) << bad;
  WriteAll(dir + "/big.json", std::string(kMaxRulesJsonBytes + 1, ' '));
  spec.rules_file = dir + "/big.json";
  EXPECT_EQ(NormalizeSpec(spec).status(),
            absl::InvalidArgumentError(
                absl::StrCat("partition rules file ", dir, "/big.json is larger than 1 MiB")));
}

TEST(SpecCodecTest, PresetNameBecomesItsRules) {
  PartitionRule replicate_all;
  replicate_all.pattern = ".*";
  replicate_all.replicate = true;
  RegisterPartitionRulePreset("spec_codec_test_preset", {replicate_all});
  const std::string cwd = fs::current_path();
  fs::current_path(MakeTempDir("preset"));  // no file of that name here
  ConversionSpec spec;
  spec.rules_file = "spec_codec_test_preset";
  absl::StatusOr<ConversionSpec> normal = NormalizeSpec(spec);
  fs::current_path(cwd);
  ASSERT_TRUE(normal.ok()) << normal.status();
  EXPECT_EQ(normal->rules_json, PartitionRulePreset("spec_codec_test_preset"));
  EXPECT_FALSE(normal->rules_json.empty());
}

TEST(SpecCodecTest, FlagsParseThroughTheRows) {
  ConversionFlags flags;
  flags.input = "in";
  flags.output = "out";
  flags.dtype = "bf16";
  flags.max_shard_size = "2MiB";
  flags.window_size = "64KiB";
  flags.io = "direct";
  flags.partition = "1/2";
  flags.no_crc_check = true;
  absl::StatusOr<ConversionSpec> spec = ParseConversionFlags(flags, /*reshard=*/false);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dtype, DTypePolicy::kBF16);
  EXPECT_EQ(spec->max_shard_size, 2u << 20);
  EXPECT_EQ(spec->window_bytes, 64u << 10);
  EXPECT_EQ(spec->io, IoMode::kDirect);
  EXPECT_EQ(spec->partition_index, 1);
  EXPECT_EQ(spec->partition_count, 2);
  EXPECT_TRUE(spec->skip_crc_check);
  EXPECT_EQ(spec->input, "in");  // normalising is NormalizeSpec's

  flags.window_size = "lots";
  absl::Status window = ParseConversionFlags(flags, false).status();
  EXPECT_EQ(window.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(window.message().rfind("--window-size: ", 0), 0u) << window;
  flags.window_size = "32MiB";
  EXPECT_EQ(ParseConversionFlags(flags, /*reshard=*/true).status(),
            absl::InvalidArgumentError("reshard needs --parts M (M >= 1)"));
}

// InvalidArgument with `message`, marked as a usage error.
void ExpectUsageError(const absl::Status& status, const std::string& message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message(), message);
  EXPECT_TRUE(IsUsageError(status)) << status;
}

// A job that would ignore --family, --config or --vocab-size refuses them, naming the flag (or
// JobSpec field) and the jobs that read it; a usage error wherever it is found.
TEST(SpecCodecTest, HfModelFlagsOnlyForTheJobsThatReadThem) {
  const std::string only_hf =
      "is only for --format hf (a Hugging Face model written from a Megatron checkpoint)";
  const std::string or_import =
      " and for a Hugging Face model imported with --format megatron or megatron-torch-dist; ";
  ConversionSpec spec;
  spec.input = "/data/in";
  spec.output = "/data/out";
  spec.hf.family = "llama";
  ExpectUsageError(ValidateSpec(spec, SpecNaming::kFlags),
                   "--family " + only_hf + or_import + "not for output format safetensors");
  EXPECT_FALSE(IsUsageError(absl::InvalidArgumentError("--family is only for")));

  spec.hf.family.clear();
  spec.hf.config_file = "/data/config.json";
  spec.output_format = "torch";
  ExpectUsageError(
      ValidateSpec(spec, SpecNaming::kProto),
      "spec.hf_config_file is only for spec.output_format hf (a Hugging Face model written from "
      "a Megatron checkpoint) and for a Hugging Face model imported with spec.output_format "
      "megatron or megatron-torch-dist; not for output format torch");

  // --vocab-size: --format hf only, also not for the Megatron outputs.
  spec.hf.config_file.clear();
  spec.hf.vocab_size = 50;
  spec.output_format = "megatron";
  ExpectUsageError(ValidateSpec(spec, SpecNaming::kFlags),
                   "--vocab-size " + only_hf + "; not for output format megatron");

  // The jobs that read them.
  spec.output_format = "hf";
  spec.hf.family = "qwen2";
  spec.hf.config_file = "/data/config.json";
  EXPECT_TRUE(ValidateSpec(spec, SpecNaming::kFlags).ok());
  spec.hf.vocab_size = 0;
  for (const char* format : {"megatron", "megatron-torch-dist"}) {
    spec.output_format = format;
    EXPECT_TRUE(ValidateSpec(spec, SpecNaming::kFlags).ok()) << format;
    // ... when the input is a Hugging Face model they import.
    EXPECT_TRUE(CheckHfImportFlags(spec, /*hf_model_imported=*/true, "safetensors",
                                   SpecNaming::kFlags)
                    .ok());
    ExpectUsageError(
        CheckHfImportFlags(spec, /*hf_model_imported=*/false, "megatron", SpecNaming::kFlags),
        "--family " + only_hf + or_import +
            "the input is megatron, not a Hugging Face model folder");
  }
  spec.hf.family.clear();
  ExpectUsageError(CheckHfImportFlags(spec, false, "megatron-torch-dist", SpecNaming::kFlags),
                   "--config " + only_hf + or_import +
                       "the input is megatron-torch-dist, not a Hugging Face model folder");
  spec.output_format = "hf";
  EXPECT_TRUE(CheckHfImportFlags(spec, false, "megatron", SpecNaming::kFlags).ok());
}

}  // namespace
}  // namespace reshard
