// The standard process_* metrics, read from /proc at every scrape and named exactly as the
// Prometheus client libraries name them (client_golang, client_python), so existing process
// dashboards work unchanged:
//
//   process_cpu_seconds_total       user + system CPU time (counter)
//   process_resident_memory_bytes   resident set size
//   process_virtual_memory_bytes    virtual memory size
//   process_start_time_seconds      start time, unix seconds
//   process_open_fds                open file descriptors
//   process_max_fds                 the soft limit on open file descriptors
//   process_threads                 OS threads (as the Rust and Java clients name it)
//
// Plus reshard_memory_in_use_bytes: resident memory above the daemon's idle baseline (its
// resident size once the server was serving, before any job ran), the memory that running
// jobs actually hold, to compare with reshard_memory_reserved_bytes and the budget.

#ifndef RESHARD_SERVER_PROCESS_COLLECTOR_H_
#define RESHARD_SERVER_PROCESS_COLLECTOR_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace reshard {

struct ProcessStats {
  double cpu_seconds = 0;
  uint64_t resident_bytes = 0;
  uint64_t virtual_bytes = 0;
  double start_time_seconds = 0;
  int64_t threads = 0;
  int64_t open_fds = -1;  // -1 when unknown
  int64_t max_fds = -1;
};

// Reads the stats of the process `pid_dir` ("/proc/self" or "/proc/<pid>"); nullopt when its
// stat file cannot be read or parsed.
std::optional<ProcessStats> ReadProcessStats(const std::string& pid_dir = "/proc/self");

// A metric family of one unlabelled counter or gauge.
prometheus::MetricFamily SingleValueFamily(const std::string& name, const std::string& help,
                                           prometheus::MetricType type, double value);

class ProcessCollector : public prometheus::Collectable {
 public:
  ProcessCollector();
  std::vector<prometheus::MetricFamily> Collect() const override;

  // Takes the resident size now as the idle baseline (the server calls it once it is
  // serving, before any job starts).
  void ResetBaseline();

 private:
  std::atomic<uint64_t> baseline_resident_bytes_{0};
};

}  // namespace reshard

#endif  // RESHARD_SERVER_PROCESS_COLLECTOR_H_
