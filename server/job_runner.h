// Runs a reshard.v1 job with the engine: the job spec becomes a ConversionSpec through the
// spec codec (proto/reshard/v1/job_spec_codec.h), the scheduler's JobContext the engine's
// RunControl.

#ifndef RESHARD_SERVER_JOB_RUNNER_H_
#define RESHARD_SERVER_JOB_RUNNER_H_

#include "absl/status/statusor.h"
#include "lib/engine/conversion.h"
#include "proto/reshard/v1/job_spec_codec.h"
#include "proto/reshard/v1/reshard.pb.h"
#include "server/scheduler.h"

namespace reshard {

// The scheduler's JobRunner.
absl::StatusOr<ConversionResult> RunJobWithEngine(const v1::Job& job, JobContext& context);

// The scheduler's MemoryEstimator: the engine's upper bound for the spec (for a spec the codec
// refuses, which SubmitJob never admits, the bound of the default settings).
uint64_t EstimateJobMemory(const v1::JobSpec& spec);

}  // namespace reshard

#endif  // RESHARD_SERVER_JOB_RUNNER_H_
