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
//
// Persistence never holds the scheduler's mutex across a store write (an fsync): a change is
// copied under the mutex with a per-job sequence number and written after it is released;
// writes of one job are ordered by that number, so an older copy never replaces a newer one.
// State changes and committed files are durable before the call that made them returns;
// progress is written by a persister thread, at most once per `persist_interval` per job.

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
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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
  // Progress is persisted at most this often per job (state changes and committed files
  // always are, at once).
  absl::Duration persist_interval = absl::Seconds(1);
  // At shutdown, how long interrupted jobs get to return after the grace. A worker still busy
  // then is abandoned: its job is recorded QUEUED (to resume at the next start) and Shutdown
  // returns without it.
  absl::Duration interrupt_wait = absl::Seconds(5);
};

struct JobPage {
  std::vector<v1::Job> jobs;
  std::string next_page_token;
};

class Scheduler;

// Memory held against the scheduler's budget by work other than a job (the metadata parsing of
// an Inspect or Plan call), given back when destroyed. The scheduler must outlive it.
class MemoryReservation {
 public:
  ~MemoryReservation();
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;
  uint64_t bytes() const { return bytes_; }

 private:
  friend class Scheduler;
  MemoryReservation(Scheduler* scheduler, uint64_t bytes) : scheduler_(scheduler), bytes_(bytes) {}

  Scheduler* const scheduler_;
  const uint64_t bytes_;
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, JobStore* store, Metrics* metrics, JobRunner runner,
            MemoryEstimator estimator);
  ~Scheduler();

  // Loads the store, recovers interrupted jobs and starts the workers.
  absl::Status Start();

  // `owner` (the submitting token's name, recorded on the job) scopes the idempotency key:
  // the same key from two owners names two jobs.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& idempotency_key,
                                 const std::string& owner = "");
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // True when a known job carries this (non-empty) idempotency key.
  bool HasIdempotencyKey(const std::string& key, const std::string& owner = "") const;
  // With `owner`, only the jobs recorded with that owner.
  absl::StatusOr<JobPage> List(const std::vector<v1::JobState>& states, int page_size,
                               const std::string& page_token, const std::string* owner = nullptr);
  absl::StatusOr<v1::Job> Cancel(const std::string& id);

  // Waits until the job's version exceeds `*version` (then updates it), the job is finished,
  // the scheduler stops, or `timeout` passes. Returns the job as it is then.
  absl::StatusOr<v1::Job> WaitForChange(const std::string& id, int64_t* version,
                                        absl::Duration timeout);

  // Refuses new submissions (Unavailable) from now on.
  void StopAccepting();
  // Stops accepting, lets running jobs finish for `grace`, then interrupts them (they keep
  // their staging folders and are queued again for the next start) and waits up to
  // `interrupt_wait` for them. Returns within about grace + interrupt_wait whatever the runners
  // do: a job whose runner has still not returned is recorded QUEUED (or CANCELLED when the
  // user had cancelled it) and its worker is abandoned. Returns the number of abandoned
  // workers. Idempotent.
  //
  // The destructor still joins abandoned workers (their runners refer to this scheduler), so a
  // process that must stop on time exits without destroying the scheduler (reshardd does).
  int Shutdown(absl::Duration grace);

  bool stopping() const;
  // False once StopAccepting or Shutdown was called.
  bool accepting() const;
  // For tests: whether a free worker would start the head of the queue now (the condition
  // every idle worker waits on), and how many WaitForChange calls are waiting on job `id`.
  bool CanStartNextForTesting() const;
  int WaitersForTesting(const std::string& id) const;
  uint64_t reserved_bytes() const;
  // Reserves `bytes` of the budget now for `what` ("Inspect"), beside the running jobs; queued
  // jobs wait until it is given back. ResourceExhausted at once when the budget has no room.
  absl::StatusOr<std::unique_ptr<MemoryReservation>> ReserveNow(uint64_t bytes,
                                                                absl::string_view what);
  uint64_t memory_budget() const { return options_.memory_budget; }

 private:
  friend class MemoryReservation;
  void Unreserve(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Orders the store writes of one job; shared by the entry and its copies in flight.
  struct RecordSlot {
    absl::Mutex mu;
    // Sequence number of the newest copy in the store (INT64_MAX once deleted).
    int64_t written ABSL_GUARDED_BY(mu) = 0;
  };
  // A copy of a job's record, taken under mu_ and written outside it.
  struct Snapshot {
    std::shared_ptr<RecordSlot> slot;
    int64_t sequence = 0;
    v1::Job job;
  };
  struct Entry {
    v1::Job job;
    int64_t version = 0;
    int64_t sequence = 0;
    uint64_t reservation = 0;
    std::shared_ptr<JobContext> context;  // while running
    int waiters = 0;                      // WaitForChange calls holding this entry
    std::shared_ptr<RecordSlot> record = std::make_shared<RecordSlot>();
    int64_t snapshots = 0;  // sequence number of the newest snapshot taken
    absl::Time last_persist;
    absl::Time last_progress_bump;
    // Output bytes of the running attempt already added to reshard_written_bytes_total.
    uint64_t bytes_counted = 0;
    // Shutdown gave up waiting for this job's runner and recorded the job itself; whatever the
    // runner does from now on is not recorded.
    bool abandoned = false;
  };
  using QueueKey = std::tuple<int, int64_t, std::string>;  // -priority, sequence, id
  using Deletion = std::pair<std::shared_ptr<RecordSlot>, std::string>;

  // Checks a submission and adds its entry (not yet queued); returns the entry's first
  // snapshot, or one without a slot holding the existing job for the same idempotency key.
  absl::StatusOr<Snapshot> AdmitLocked(const v1::JobSpec& spec, const std::string& idempotency_key,
                                       const std::string& owner, uint64_t reservation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancel without the store writes, which it appends to `writes`.
  absl::StatusOr<v1::Job> CancelInMemory(const std::string& id, std::vector<Snapshot>& writes)
      ABSL_LOCKS_EXCLUDED(mu_);
  void WorkerLoop();
  // Writes the progress of running jobs, at most once per persist_interval per job.
  void PersistLoop();
  // The job goes on after its record could not be written; the record catches up at its
  // next change.
  static void NotePersistFailure(v1::Job& job, const absl::Status& status);
  bool CanStartLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnqueueLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Snapshot SnapshotLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `snapshot` unless a newer one of the same job is already stored.
  absl::Status Write(const Snapshot& snapshot) ABSL_LOCKS_EXCLUDED(mu_);
  // Write(), and on failure a note on the job (the record catches up at its next change).
  void Persist(const Snapshot& snapshot) ABSL_LOCKS_EXCLUDED(mu_);
  void PersistAll(const std::vector<Snapshot>& snapshots, const std::vector<Deletion>& deletions)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ChangedLocked(Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Snapshot FinishLocked(Entry& entry, v1::JobState state, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets expired jobs; returns their records, to delete outside mu_.
  std::vector<Deletion> PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SchedulerOptions options_;
  JobStore* const store_;
  Metrics* const metrics_;
  const JobRunner runner_;
  const MemoryEstimator estimator_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> jobs_ ABSL_GUARDED_BY(mu_);
  // (owner, idempotency key) -> job id.
  absl::flat_hash_map<std::pair<std::string, std::string>, std::string> by_key_
      ABSL_GUARDED_BY(mu_);
  std::set<QueueKey> queue_ ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_started_ ABSL_GUARDED_BY(mu_) = false;
  // Submissions admitted whose record is being written (queued once it is).
  int recording_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers that took a job and have not finished recording its end.
  int busy_workers_ ABSL_GUARDED_BY(mu_) = 0;
  int abandoned_ ABSL_GUARDED_BY(mu_) = 0;
  // Running jobs whose progress is not yet in the store.
  absl::flat_hash_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
  std::thread persister_;
};

bool IsTerminal(v1::JobState state);

}  // namespace reshard

#endif  // RESHARD_SERVER_SCHEDULER_H_
