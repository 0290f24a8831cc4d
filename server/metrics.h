// reshardd's Prometheus metrics, registered once at startup with fixed, low-cardinality
// labels (job kind and result; never paths or job ids). Every labelled series is created up
// front so dashboards show zeros instead of gaps. Thread safe (prometheus-cpp metrics are).

#ifndef RESHARD_SERVER_METRICS_H_
#define RESHARD_SERVER_METRICS_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace reshard {

class Metrics {
 public:
  Metrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // kind: "consolidate" | "reshard"; result: "succeeded" | "failed" | "cancelled".
  void JobSubmitted(absl::string_view kind);
  void JobFinished(absl::string_view kind, absl::string_view result, double seconds);
  void SetQueueState(int queued, int running);
  void SetMemory(uint64_t budget_bytes, uint64_t reserved_bytes);
  void AddBytes(uint64_t read, uint64_t written);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& submitted_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Gauge& queued_;
  prometheus::Gauge& running_;
  prometheus::Gauge& memory_budget_;
  prometheus::Gauge& memory_reserved_;
  prometheus::Counter& bytes_read_;
  prometheus::Counter& bytes_written_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_METRICS_H_
