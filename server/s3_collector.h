// Prometheus counters of the daemon's S3 requests (s3:// inputs and outputs), read from the
// shared client (lib/io/s3/default_client.h) at every scrape:
//
//   reshard_s3_requests_total   HTTP requests sent to the object store, retries included
//   reshard_s3_retries_total    requests that were retries (5xx, SlowDown, timeouts, drops)
//
// Both are 0 until a job first touches an s3:// path; a rising retry rate points at a
// throttling or failing store before jobs fail.

#ifndef RESHARD_SERVER_S3_COLLECTOR_H_
#define RESHARD_SERVER_S3_COLLECTOR_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace reshard {

class S3Collector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_S3_COLLECTOR_H_
