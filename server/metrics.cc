#include "server/metrics.h"

#include <string>

namespace reshard {
namespace {

constexpr const char* kKinds[] = {"consolidate", "reshard"};
constexpr const char* kResults[] = {"succeeded", "failed", "cancelled"};

// From one second to one day: conversions of large models take hours.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400};
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
                      .Help("Checkpoint bytes read by finished job attempts.")
                      .Register(*registry_)
                      .Add({})),
      bytes_written_(prometheus::BuildCounter()
                         .Name("reshard_written_bytes_total")
                         .Help("Output bytes written by finished job attempts.")
                         .Register(*registry_)
                         .Add({})) {
  for (const char* kind : kKinds) {
    submitted_.Add({{"kind", kind}});
    duration_.Add({{"kind", kind}}, DurationBuckets());
    for (const char* result : kResults) finished_.Add({{"kind", kind}, {"result", result}});
  }
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

}  // namespace reshard
