#include "proto/reshard/v1/job_spec_codec.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "lib/engine/spec_codec.h"
#include "lib/engine/spec_codec_testing.h"

namespace reshard {
namespace {

TEST(JobSpecCodecTest, EveryJobSpecFieldIsARowOrTheJobs) {
  std::set<std::string> bound;
  for (const SpecField& field : SpecFields()) {
    if (!field.proto.empty()) bound.insert(std::string(field.proto));
  }
  for (absl::string_view name : kJobOnlyFields) bound.insert(std::string(name));
  const google::protobuf::Descriptor* descriptor = v1::JobSpec::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    EXPECT_EQ(bound.count(descriptor->field(i)->name()), 1u)
        << "JobSpec." << descriptor->field(i)->name()
        << " has no row in SpecFields() (lib/engine/spec_codec.cc) and is not a job field";
  }
}

TEST(JobSpecCodecTest, EveryRowRoundTrips) {
  const ConversionSpec spec = EverySpecFieldSet();
  const v1::JobSpec proto = JobSpecFromConversionSpec(spec);
  absl::StatusOr<ConversionSpec> back = ConversionSpecFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  const ConversionSpec defaults;
  for (const SpecField& field : SpecFields()) {
    if (field.proto.empty()) continue;
    EXPECT_NE(SpecFieldText(spec, field), SpecFieldText(defaults, field))
        << field.name << ": EverySpecFieldSet() leaves it at its default, so this proves nothing";
    EXPECT_EQ(SpecFieldText(*back, field), SpecFieldText(spec, field)) << field.name;
  }
  EXPECT_EQ(proto.dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(proto.kind(), v1::JOB_KIND_RESHARD);
  EXPECT_EQ(proto.io(), "buffered");
  EXPECT_EQ(proto.memory_budget(), 0u);
  EXPECT_EQ(proto.priority(), 0);
}

TEST(JobSpecCodecTest, ZeroFieldsAreTheDefaults) {
  v1::JobSpec proto;
  proto.set_kind(v1::JOB_KIND_CONSOLIDATE);
  proto.set_input("/in");
  proto.set_output("/out");
  absl::StatusOr<ConversionSpec> spec = ConversionSpecFromProto(proto);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_shard_size, 5'000'000'000ull);
  EXPECT_EQ(spec->threads, 2);
  EXPECT_EQ(spec->window_bytes, 32ull << 20);
  EXPECT_EQ(spec->output_format, "safetensors");
  EXPECT_EQ(spec->io, IoMode::kAuto);
  EXPECT_EQ(spec->dtype, DTypePolicy::kKeep);
  EXPECT_TRUE(ValidateSpec(*spec, SpecNaming::kProto).ok());
}

TEST(JobSpecCodecTest, ValuesNoSpecHoldsNameTheField) {
  v1::JobSpec proto;
  proto.set_input("/in");
  EXPECT_EQ(ConversionSpecFromProto(proto).status(),
            absl::InvalidArgumentError(
                "spec.kind must be JOB_KIND_CONSOLIDATE or JOB_KIND_RESHARD"));
  proto.set_kind(v1::JOB_KIND_CONSOLIDATE);
  proto.set_dtype(static_cast<v1::DType>(9));
  EXPECT_EQ(ConversionSpecFromProto(proto).status(),
            absl::InvalidArgumentError("spec.dtype is unknown"));
  proto.set_dtype(v1::DTYPE_FP16);
  proto.set_io("sideways");
  absl::Status io = ConversionSpecFromProto(proto).status();
  EXPECT_EQ(io.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(io.message().rfind("spec.io: ", 0), 0u) << io;
}

TEST(JobSpecCodecTest, RangesAreNamedAsTheRouteNamesThem) {
  ConversionSpec spec = ValidSpecWithFieldsSet();
  spec.threads = 100;
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kProto),
            absl::InvalidArgumentError("spec.threads must be in [1, 64] (0: 2), got 100"));
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kFlags),
            absl::InvalidArgumentError("--threads must be in [1, 64] (0: 2), got 100"));
  spec = ValidSpecWithFieldsSet();
  spec.kind = ConversionSpec::Kind::kConsolidate;
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kProto),
            absl::InvalidArgumentError("spec.parts is only for JOB_KIND_RESHARD"));
  spec.parts = 0;
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kFlags),
            absl::InvalidArgumentError(
                "--pipeline-parts must be in [0, 4096], and only for reshard"));
  spec = ValidSpecWithFieldsSet();
  spec.output_format = "torch";
  const absl::Status pipeline = ValidateSpec(spec, SpecNaming::kProto);
  EXPECT_EQ(pipeline.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pipeline.message(),
            "spec.pipeline_parts is only for spec.output_format megatron and "
            "megatron-torch-dist (the outputs with pipeline stages); not for output format torch");
  spec.pipeline_parts = 0;
  const absl::Status experts = ValidateSpec(spec, SpecNaming::kProto);
  EXPECT_EQ(experts.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(experts.message(),
            "spec.expert_parts is only for output formats megatron and megatron-torch-dist, not "
            "torch");
  EXPECT_TRUE(IsUsageError(experts));
  spec = ValidSpecWithFieldsSet();
  spec.partition_index = 3;
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kFlags),
            absl::InvalidArgumentError("--partition I/K needs 0 <= I < K <= 4096, got 3/3"));
  spec = ValidSpecWithFieldsSet();
  spec.read.tag = "../x";
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kFlags),
            absl::InvalidArgumentError(
                R"(tag "../x" (from --tag) is not a plain folder name)"));
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kProto),
            absl::InvalidArgumentError(
                R"(tag "../x" (from spec.tag) is not a plain folder name)"));
  spec = ValidSpecWithFieldsSet();
  spec.rules_json = std::string(kMaxRulesJsonBytes + 1, ' ');
  EXPECT_EQ(ValidateSpec(spec, SpecNaming::kProto),
            absl::InvalidArgumentError("spec.rules_json is larger than 1 MiB"));
}

}  // namespace
}  // namespace reshard
