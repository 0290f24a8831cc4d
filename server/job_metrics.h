// What the scheduler records in Metrics (server/metrics.h) about a job: its end (result,
// duration, peak memory, last success) and the figures of a successful attempt (bytes, output,
// phases).

#ifndef RESHARD_SERVER_JOB_METRICS_H_
#define RESHARD_SERVER_JOB_METRICS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "lib/engine/conversion.h"
#include "proto/reshard/v1/reshard.pb.h"
#include "server/metrics.h"

namespace reshard {

// The job kind label of the metrics: "consolidate" / "reshard".
absl::string_view JobKindLabel(v1::JobKind kind);

// Records the end of `job` in state `state` (SUCCEEDED, FAILED or CANCELLED; finished_unix
// set): the job counter and duration by kind and result, the peak RSS of a job that started,
// and the time of the last success.
void RecordJobEnd(const v1::Job& job, v1::JobState state, Metrics& metrics);

// Records a successful attempt of `job`: the bytes read, the bytes written not yet counted
// from progress (`bytes_counted` were), so that the counter moves by exactly the job's
// bytes_written; tensors and files written; verification failures; and each phase's time
// (verify only on a resumed attempt).
void RecordJobResult(const v1::Job& job, const ConversionResult& result, uint64_t bytes_counted,
                     Metrics& metrics);

}  // namespace reshard

#endif  // RESHARD_SERVER_JOB_METRICS_H_
