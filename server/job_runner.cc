#include "server/job_runner.h"

#include "lib/engine/partitioned_conversion.h"

namespace reshard {

ConversionSpec ConversionSpecFromProto(const v1::JobSpec& proto) {
  ConversionSpec spec;
  spec.kind = proto.kind() == v1::JOB_KIND_RESHARD ? ConversionSpec::Kind::kReshard
                                                   : ConversionSpec::Kind::kConsolidate;
  spec.input = proto.input();
  spec.output = proto.output();
  switch (proto.dtype()) {
    case v1::DTYPE_FP32:
      spec.dtype = DTypePolicy::kF32;
      break;
    case v1::DTYPE_BF16:
      spec.dtype = DTypePolicy::kBF16;
      break;
    case v1::DTYPE_FP16:
      spec.dtype = DTypePolicy::kF16;
      break;
    default:
      spec.dtype = DTypePolicy::kKeep;
  }
  if (proto.max_shard_size() > 0) spec.max_shard_size = proto.max_shard_size();
  spec.parts = proto.parts();
  spec.pipeline_parts = proto.pipeline_parts();
  spec.update_latest = proto.update_latest();
  spec.rules_json = proto.rules_json();
  spec.overwrite = proto.overwrite();
  spec.duplicate_tied = proto.duplicate_tied();
  spec.skip_crc_check = proto.skip_crc_check();
  // SubmitJob validated it; empty is the default.
  if (!proto.io().empty()) spec.io = ParseIoMode(proto.io()).value_or(IoMode::kAuto);
  if (!proto.output_format().empty()) spec.output_format = proto.output_format();
  spec.read.tag = proto.tag();
  spec.read.include_optimizer = proto.include_optimizer();
  if (proto.threads() > 0) spec.threads = proto.threads();
  if (proto.window_bytes() > 0) spec.window_bytes = proto.window_bytes();
  spec.partition_index = proto.partition_index();
  spec.partition_count = proto.partition_count();
  return spec;
}

absl::StatusOr<ConversionResult> RunJobWithEngine(const v1::Job& job, JobContext& context) {
  RunControl control;
  control.cancelled = &context.cancelled;
  control.preserve_staging = &context.preserve_staging;
  control.resume = context.resume;
  control.completed_files = context.completed_files;
  control.on_progress = context.on_progress;
  control.on_file_committed = context.on_file_committed;
  control.job_id = job.id();
  return RunAnyConversion(ConversionSpecFromProto(job.spec()), control);
}

uint64_t EstimateJobMemory(const v1::JobSpec& spec) {
  return MemoryUpperBound(ConversionSpecFromProto(spec));
}

}  // namespace reshard
