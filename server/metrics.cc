#include "server/metrics.h"

#include <string>

#include "lib/core/version.h"
#include "server/build_info.h"

namespace reshard {
namespace {

constexpr const char* kKinds[] = {"consolidate", "reshard"};
constexpr const char* kResults[] = {"succeeded", "failed", "cancelled"};

// From one second to one day: conversions of large models take hours.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400};
}

// Phases of small jobs take milliseconds (an fsync, a manifest), of large ones hours.
prometheus::Histogram::BucketBoundaries PhaseBuckets() {
  return {0.01, 0.05, 0.1,  0.5,  1,    5,    15,    30,    60,   120,
          300,  600,  1200, 1800, 3600, 7200, 14400, 28800, 86400};
}

// 64 MiB to 1 TiB in powers of 4, the resident sizes of hosts that convert checkpoints.
prometheus::Histogram::BucketBoundaries RssBuckets() {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double bytes = 64.0 * (1 << 20); bytes <= 1024.0 * (1ull << 30); bytes *= 4) {
    buckets.push_back(bytes);
  }
  return buckets;
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      submitted_(prometheus::BuildCounter()
                     .Name("reshard_jobs_submitted_total")
                     .Help("Jobs accepted by SubmitJob, by kind.")
                     .Register(*registry_)),
      finished_(prometheus::BuildCounter()
                    .Name("reshard_jobs_finished_total")
                    .Help("Jobs that reached a terminal state, by kind and result.")
                    .Register(*registry_)),
      duration_(prometheus::BuildHistogram()
                    .Name("reshard_job_duration_seconds")
                    .Help("Wall time of finished jobs from start to end, by kind.")
                    .Register(*registry_)),
      phase_duration_(prometheus::BuildHistogram()
                          .Name("reshard_job_phase_duration_seconds")
                          .Help("Time successful jobs spent per phase: plan and publish are "
                                "wall time, the others are summed over worker threads.")
                          .Register(*registry_)),
      last_success_(prometheus::BuildGauge()
                        .Name("reshard_last_success_timestamp_seconds")
                        .Help("Unix time a job of this kind last succeeded (0: none known).")
                        .Register(*registry_)),
      queued_(prometheus::BuildGauge()
                  .Name("reshard_jobs_queued")
                  .Help("Jobs waiting to run.")
                  .Register(*registry_)
                  .Add({})),
      running_(prometheus::BuildGauge()
                   .Name("reshard_jobs_running")
                   .Help("Jobs running now.")
                   .Register(*registry_)
                   .Add({})),
      memory_budget_(prometheus::BuildGauge()
                         .Name("reshard_memory_budget_bytes")
                         .Help("Daemon-wide memory budget that running jobs reserve from.")
                         .Register(*registry_)
                         .Add({})),
      memory_reserved_(prometheus::BuildGauge()
                           .Name("reshard_memory_reserved_bytes")
                           .Help("Memory reserved by running jobs.")
                           .Register(*registry_)
                           .Add({})),
      bytes_read_(prometheus::BuildCounter()
                      .Name("reshard_read_bytes_total")
                      .Help("Checkpoint bytes read, counted when a job attempt succeeds.")
                      .Register(*registry_)
                      .Add({})),
      bytes_written_(prometheus::BuildCounter()
                         .Name("reshard_written_bytes_total")
                         .Help("Output bytes written, counted as data windows are written.")
                         .Register(*registry_)
                         .Add({})),
      tensors_written_(prometheus::BuildCounter()
                           .Name("reshard_tensors_written_total")
                           .Help("Tensors in the outputs of successful jobs.")
                           .Register(*registry_)
                           .Add({})),
      files_written_(prometheus::BuildCounter()
                         .Name("reshard_files_written_total")
                         .Help("Output files (data files and indexes) of successful jobs.")
                         .Register(*registry_)
                         .Add({})),
      verification_failures_(prometheus::BuildCounter()
                                 .Name("reshard_verification_failures_total")
                                 .Help("Files kept from an interrupted attempt whose checksum "
                                       "no longer matched on resume (rewritten).")
                                 .Register(*registry_)
                                 .Add({})),
      tls_handshake_failures_(prometheus::BuildCounter()
                                  .Name("reshard_tls_handshake_failures_total")
                                  .Help("Connections to the gRPC port whose TLS handshake "
                                        "failed (not TLS, no or an untrusted client "
                                        "certificate, ...).")
                                  .Register(*registry_)
                                  .Add({})),
      peak_rss_(prometheus::BuildHistogram()
                    .Name("reshard_job_peak_rss_bytes")
                    .Help("Peak resident memory of the daemon sampled while a job ran.")
                    .Register(*registry_)
                    .Add({}, RssBuckets())) {
  for (const char* kind : kKinds) {
    submitted_.Add({{"kind", kind}});
    duration_.Add({{"kind", kind}}, DurationBuckets());
    last_success_.Add({{"kind", kind}});
    for (const char* result : kResults) finished_.Add({{"kind", kind}, {"result", result}});
  }
  for (const char* phase : kJobPhases) phase_duration_.Add({{"phase", phase}}, PhaseBuckets());
  prometheus::BuildGauge()
      .Name("reshard_build_info")
      .Help("Always 1; the labels say which reshardd build this is.")
      .Register(*registry_)
      .Add({{"version", kReshardVersion}, {"revision", BuildRevision()}})
      .Set(1);
}

void Metrics::JobSubmitted(absl::string_view kind) {
  submitted_.Add({{"kind", std::string(kind)}}).Increment();
}

void Metrics::JobFinished(absl::string_view kind, absl::string_view result, double seconds) {
  finished_.Add({{"kind", std::string(kind)}, {"result", std::string(result)}}).Increment();
  duration_.Add({{"kind", std::string(kind)}}, DurationBuckets()).Observe(seconds);
}

void Metrics::SetQueueState(int queued, int running) {
  queued_.Set(queued);
  running_.Set(running);
}

void Metrics::SetMemory(uint64_t budget_bytes, uint64_t reserved_bytes) {
  memory_budget_.Set(static_cast<double>(budget_bytes));
  memory_reserved_.Set(static_cast<double>(reserved_bytes));
}

void Metrics::AddBytes(uint64_t read, uint64_t written) {
  bytes_read_.Increment(static_cast<double>(read));
  bytes_written_.Increment(static_cast<double>(written));
}

void Metrics::AddOutput(int64_t tensors, int64_t files) {
  tensors_written_.Increment(static_cast<double>(tensors));
  files_written_.Increment(static_cast<double>(files));
}

void Metrics::ObservePhase(absl::string_view phase, double seconds) {
  phase_duration_.Add({{"phase", std::string(phase)}}, PhaseBuckets()).Observe(seconds);
}

void Metrics::ObservePeakRss(uint64_t bytes) { peak_rss_.Observe(static_cast<double>(bytes)); }

void Metrics::SetLastSuccess(absl::string_view kind, double unix_seconds) {
  absl::MutexLock lock(&last_success_mu_);
  prometheus::Gauge& gauge = last_success_.Add({{"kind", std::string(kind)}});
  if (unix_seconds > gauge.Value()) gauge.Set(unix_seconds);
}

void Metrics::AddVerificationFailures(int count) {
  if (count > 0) verification_failures_.Increment(count);
}

}  // namespace reshard
