// Runs a reshard.v1 job with the engine: translates the job spec to a ConversionSpec and the
// scheduler's JobContext to the engine's RunControl.

#ifndef RESHARD_SERVER_JOB_RUNNER_H_
#define RESHARD_SERVER_JOB_RUNNER_H_

#include "absl/status/statusor.h"
#include "lib/engine/conversion.h"
#include "proto/reshard/v1/reshard.pb.h"
#include "server/scheduler.h"

namespace reshard {

// The engine spec of a validated job spec (paths already resolved by the service).
ConversionSpec ConversionSpecFromProto(const v1::JobSpec& spec);

// The scheduler's JobRunner.
absl::StatusOr<ConversionResult> RunJobWithEngine(const v1::Job& job, JobContext& context);

// The scheduler's MemoryEstimator: the engine's upper bound for the spec.
uint64_t EstimateJobMemory(const v1::JobSpec& spec);

}  // namespace reshard

#endif  // RESHARD_SERVER_JOB_RUNNER_H_
