#include "server/s3_collector.h"

#include <optional>

#include "lib/io/s3/default_client.h"
#include "server/process_collector.h"

namespace reshard {

std::vector<prometheus::MetricFamily> S3Collector::Collect() const {
  const std::optional<S3ClientStats> stats = DefaultS3ClientStats();
  const S3ClientStats counted = stats.value_or(S3ClientStats());
  return {
      SingleValueFamily("reshard_s3_requests_total",
                        "HTTP requests sent to the S3 object store, retries included.",
                        prometheus::MetricType::Counter, static_cast<double>(counted.requests)),
      SingleValueFamily("reshard_s3_retries_total", "S3 requests that retried an earlier attempt.",
                        prometheus::MetricType::Counter, static_cast<double>(counted.retries))};
}

}  // namespace reshard
