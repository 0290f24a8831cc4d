#include "server/job_runner.h"

#include "lib/core/status.h"
#include "lib/engine/partitioned_conversion.h"

namespace reshard {

absl::StatusOr<ConversionResult> RunJobWithEngine(const v1::Job& job, JobContext& context) {
  RunControl control;
  control.cancelled = &context.cancelled;
  control.preserve_staging = &context.preserve_staging;
  control.resume = context.resume;
  control.on_progress = context.on_progress;
  control.on_file_committed = context.on_file_committed;
  control.job_id = job.id();
  ASSIGN_OR_RETURN(const ConversionSpec spec, ConversionSpecFromProto(job.spec()));
  return RunAnyConversion(spec, control);
}

uint64_t EstimateJobMemory(const v1::JobSpec& spec) {
  return MemoryUpperBound(ConversionSpecFromProto(spec).value_or(ConversionSpec()));
}

}  // namespace reshard
