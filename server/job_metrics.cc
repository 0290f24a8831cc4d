#include "server/job_metrics.h"

namespace reshard {

absl::string_view JobKindLabel(v1::JobKind kind) {
  return kind == v1::JOB_KIND_RESHARD ? "reshard" : "consolidate";
}

void RecordJobEnd(const v1::Job& job, v1::JobState state, Metrics& metrics) {
  const absl::string_view kind = JobKindLabel(job.spec().kind());
  const double started = job.started_unix() > 0 ? job.started_unix() : job.finished_unix();
  metrics.JobFinished(kind,
                      state == v1::JOB_STATE_SUCCEEDED   ? "succeeded"
                      : state == v1::JOB_STATE_CANCELLED ? "cancelled"
                                                         : "failed",
                      job.finished_unix() - started);
  if (job.started_unix() > 0) metrics.ObservePeakRss(job.peak_rss_bytes());
  if (state == v1::JOB_STATE_SUCCEEDED) metrics.SetLastSuccess(kind, job.finished_unix());
}

void RecordJobResult(const v1::Job& job, const ConversionResult& result, uint64_t bytes_counted,
                     Metrics& metrics) {
  // The index and manifest (and any data not reported as progress) are added now.
  const uint64_t rest =
      result.bytes_written > bytes_counted ? result.bytes_written - bytes_counted : 0;
  metrics.AddBytes(result.bytes_read, rest);
  metrics.AddOutput(result.tensors, static_cast<int64_t>(result.files.size()));
  metrics.AddVerificationFailures(result.verification_failures);
  const PhaseSeconds& data = result.data_phases;
  metrics.ObservePhase("plan", result.plan_seconds);
  metrics.ObservePhase("read", data.read);
  metrics.ObservePhase("convert", data.convert);
  metrics.ObservePhase("write", data.write);
  metrics.ObservePhase("fsync", data.fsync);
  if (job.attempts() > 1) metrics.ObservePhase("verify", data.verify);
  metrics.ObservePhase("publish", result.publish_seconds);
}

}  // namespace reshard
