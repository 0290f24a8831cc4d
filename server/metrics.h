// reshardd's Prometheus metrics, registered once at startup with fixed, low-cardinality
// labels (job kind, result and phase; never paths or job ids). Every labelled series is created
// up front so dashboards show zeros instead of gaps. Thread safe (prometheus-cpp metrics are).
//
// Names follow Prometheus conventions: base units (seconds, bytes), `_total` for counters,
// `reshard_build_info` = 1 for build metadata. The process_* metrics come from
// ProcessCollector (process_collector.h), the grpc_server_* ones from GrpcServerMetrics
// (grpc_metrics.h); docs/operations.md describes every metric.

#ifndef RESHARD_SERVER_METRICS_H_
#define RESHARD_SERVER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace reshard {

// The phases of reshard_job_phase_duration_seconds{phase}.
inline constexpr const char* kJobPhases[] = {"plan",  "read",   "convert", "write",
                                             "fsync", "verify", "publish"};

class Metrics {
 public:
  Metrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // kind: "consolidate" | "reshard"; result: "succeeded" | "failed" | "cancelled".
  void JobSubmitted(absl::string_view kind);
  void JobFinished(absl::string_view kind, absl::string_view result, double seconds);
  void SetQueueState(int queued, int running);
  void SetMemory(uint64_t budget_bytes, uint64_t reserved_bytes);
  // Source bytes read and output bytes written (counted as they happen or when an attempt
  // ends; see Scheduler).
  void AddBytes(uint64_t read, uint64_t written);
  // Output of a successful attempt.
  void AddOutput(int64_t tensors, int64_t files);
  // `phase` is one of kJobPhases.
  void ObservePhase(absl::string_view phase, double seconds);
  // Peak resident memory sampled while a job ran.
  void ObservePeakRss(uint64_t bytes);
  // Keeps the latest time (unix seconds) a job of `kind` succeeded.
  void SetLastSuccess(absl::string_view kind, double unix_seconds);
  // Files kept from an interrupted attempt whose checksum no longer matched on resume.
  void AddVerificationFailures(int count);
  // A peer failed the TLS handshake on the gRPC port (TlsHandshakeLog).
  void TlsHandshakeFailed() { tls_handshake_failures_.Increment(); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& submitted_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Histogram>& phase_duration_;
  prometheus::Family<prometheus::Gauge>& last_success_;
  prometheus::Gauge& queued_;
  prometheus::Gauge& running_;
  prometheus::Gauge& memory_budget_;
  prometheus::Gauge& memory_reserved_;
  prometheus::Counter& bytes_read_;
  prometheus::Counter& bytes_written_;
  prometheus::Counter& tensors_written_;
  prometheus::Counter& files_written_;
  prometheus::Counter& verification_failures_;
  prometheus::Counter& tls_handshake_failures_;
  prometheus::Histogram& peak_rss_;
  absl::Mutex last_success_mu_;  // makes SetLastSuccess's read-compare-set atomic
};

}  // namespace reshard

#endif  // RESHARD_SERVER_METRICS_H_
