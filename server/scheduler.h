// The job scheduler of reshardd: a priority + FIFO queue, admission against a daemon-wide
// memory budget, a bounded pool of worker threads, cancellation, persistence of every state
// change through the JobStore, and recovery of interrupted jobs at start.
//
// A job reserves max(spec.memory_budget, the engine's upper bound for its spec) while it runs;
// a job that could never fit the budget is refused at submit (ResourceExhausted). Jobs start
// strictly in queue order (highest priority first, then submission order): the head waits
// until enough budget is free, so large jobs are not starved by small ones.
//
// Jobs found RUNNING at start were interrupted by a crash: they are queued again to resume
// (files they had committed are kept when their checksums still match), up to
// `max_attempts`, then failed with an explanation. No CPU or IO work happens on the calling
// (gRPC) threads except persisting the job record.

#ifndef RESHARD_SERVER_SCHEDULER_H_
#define RESHARD_SERVER_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/engine/conversion.h"
#include "proto/reshard/v1/reshard.pb.h"
#include "server/job_store.h"
#include "server/metrics.h"

namespace reshard {

// What a running job may observe and report. Owned by the scheduler; shared with the runner.
struct JobContext {
  std::atomic<bool> cancelled{false};
  // Set with `cancelled` at shutdown: keep the staging folder so the job can resume.
  std::atomic<bool> preserve_staging{false};
  bool resume = false;
  std::map<std::string, uint64_t> completed_files;
  std::function<void(const Progress&)> on_progress;
  std::function<void(const WrittenFile&)> on_file_committed;
};

// Runs one job to completion (the real one calls the engine; tests inject fakes).
using JobRunner =
    std::function<absl::StatusOr<ConversionResult>(const v1::Job& job, JobContext& context)>;

// The memory a job reserves from the budget (no IO).
using MemoryEstimator = std::function<uint64_t(const v1::JobSpec& spec)>;

struct SchedulerOptions {
  uint64_t memory_budget = 8ull << 30;
  int max_concurrent_jobs = 2;
  int max_queue = 1000;
  int max_attempts = 3;
  absl::Duration retention = absl::Hours(24 * 7);
  // Progress is persisted at most this often per job (state changes always are).
  absl::Duration persist_interval = absl::Seconds(2);
};

struct JobPage {
  std::vector<v1::Job> jobs;
  std::string next_page_token;
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, JobStore* store, Metrics* metrics, JobRunner runner,
            MemoryEstimator estimator);
  ~Scheduler();

  // Loads the store, recovers interrupted jobs and starts the workers.
  absl::Status Start();

  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& idempotency_key);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // True when a known job carries this (non-empty) idempotency key.
  bool HasIdempotencyKey(const std::string& key) const;
  absl::StatusOr<JobPage> List(const std::vector<v1::JobState>& states, int page_size,
                               const std::string& page_token);
  absl::StatusOr<v1::Job> Cancel(const std::string& id);

  // Waits until the job's version exceeds `*version` (then updates it), the job is finished,
  // the scheduler stops, or `timeout` passes. Returns the job as it is then.
  absl::StatusOr<v1::Job> WaitForChange(const std::string& id, int64_t* version,
                                        absl::Duration timeout);

  // Refuses new submissions (Unavailable) from now on.
  void StopAccepting();
  // Stops accepting, lets running jobs finish for `grace`, then interrupts them (they keep
  // their staging folders and are queued again for the next start) and joins the workers.
  void Shutdown(absl::Duration grace);

  bool stopping() const;
  uint64_t reserved_bytes() const;
  uint64_t memory_budget() const { return options_.memory_budget; }

 private:
  struct Entry {
    v1::Job job;
    int64_t version = 0;
    int64_t sequence = 0;
    uint64_t reservation = 0;
    std::shared_ptr<JobContext> context;  // while running
    int waiters = 0;                      // WaitForChange calls holding this entry
    absl::Time last_persist;
    absl::Time last_progress_bump;
    // Output bytes of the running attempt already added to reshard_written_bytes_total.
    uint64_t bytes_counted = 0;
  };
  using QueueKey = std::tuple<int, int64_t, std::string>;  // -priority, sequence, id

  void WorkerLoop();
  bool CanStartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChangedLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(Entry& entry, v1::JobState state, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  JobStore* const store_;
  Metrics* const metrics_;
  const JobRunner runner_;
  const MemoryEstimator estimator_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> by_key_ ABSL_GUARDED_BY(mu_);
  std::set<QueueKey> queue_ ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// "consolidate" / "reshard".
absl::string_view JobKindLabel(v1::JobKind kind);
bool IsTerminal(v1::JobState state);

}  // namespace reshard

#endif  // RESHARD_SERVER_SCHEDULER_H_
