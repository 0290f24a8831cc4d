#include "server/scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/message_differencer.h"
#include "lib/core/status.h"
#include "lib/engine/spec_codec.h"
#include "server/job_metrics.h"
#include "server/job_result.h"

namespace reshard {
namespace {

double NowUnix() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

// Resident memory of this process now, from /proc/self/statm (0 when unreadable).
uint64_t ResidentBytes() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int fields = std::fscanf(statm, "%llu %llu", &size, &resident);
  std::fclose(statm);
  return fields == 2 ? resident * page : 0;
}

std::string NewJobId() {
  static absl::Mutex mu(absl::kConstInit);
  static absl::BitGen* gen = new absl::BitGen;
  absl::MutexLock lock(&mu);
  return absl::StrFormat("j-%016x", absl::Uniform<uint64_t>(*gen));
}

void SetError(v1::Job& job, const absl::Status& status) {
  v1::JobError* error = job.mutable_error();
  error->set_code(static_cast<int>(status.code()));
  error->set_code_name(absl::StatusCodeToString(status.code()));  // "INVALID_ARGUMENT"
  error->set_message(std::string(status.message()));
  error->set_usage_error(IsUsageError(status));
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

Scheduler::Scheduler(SchedulerOptions options, JobStore* store, Metrics* metrics, JobRunner runner,
                     MemoryEstimator estimator)
    : options_(std::move(options)),
      store_(store),
      metrics_(metrics),
      runner_(std::move(runner)),
      estimator_(std::move(estimator)) {}

Scheduler::~Scheduler() {
  Shutdown(absl::ZeroDuration());
  // Workers Shutdown abandoned are joined here: their runners still refer to this scheduler.
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

absl::Status Scheduler::Start() {
  ASSIGN_OR_RETURN(std::vector<v1::Job> stored, store_->LoadAll());
  std::vector<Snapshot> writes;
  std::vector<Deletion> deletions;
  {
    absl::MutexLock lock(&mu_);
    for (v1::Job& job : stored) {
      auto entry = std::make_unique<Entry>();
      entry->job = std::move(job);
      entry->sequence = next_sequence_++;
      entry->reservation =
          std::max<uint64_t>(entry->job.reserved_memory_bytes(), estimator_(entry->job.spec()));
      Entry& e = *entry;
      if (!e.job.idempotency_key().empty()) {
        by_key_[{e.job.owner(), e.job.idempotency_key()}] = e.job.id();
      }
      jobs_[e.job.id()] = std::move(entry);
      if (metrics_ != nullptr && e.job.state() == v1::JOB_STATE_SUCCEEDED) {
        // Survives restarts, so "no success in N hours" alerts do not fire after one.
        metrics_->SetLastSuccess(JobKindLabel(e.job.spec().kind()), e.job.finished_unix());
      }
      if (e.job.state() == v1::JOB_STATE_RUNNING) {
        // The daemon died while this job ran.
        if (e.job.attempts() >= options_.max_attempts) {
          writes.push_back(FinishLocked(
              e, v1::JOB_STATE_FAILED,
              absl::AbortedError(absl::StrCat(
                  "interrupted ", e.job.attempts(),
                  " times by daemon restarts; giving up (the output was never published)"))));
          continue;
        }
        e.job.set_state(v1::JOB_STATE_QUEUED);
        e.job.set_note(absl::StrCat("the daemon stopped during attempt ", e.job.attempts(),
                                    "; queued to resume (finished files are kept only if their "
                                    "checksums match)"));
        writes.push_back(SnapshotLocked(e));
      }
      if (e.job.state() == v1::JOB_STATE_QUEUED) EnqueueLocked(e);
    }
    deletions = PruneLocked();
    UpdateGaugesLocked();
  }
  // Nothing runs yet, so these are written before any other change to the same jobs.
  PersistAll(writes, deletions);
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < options_.max_concurrent_jobs; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
  persister_ = std::thread([this] { PersistLoop(); });
  return absl::OkStatus();
}

void Scheduler::EnqueueLocked(Entry& entry) {
  queue_.insert({-entry.job.spec().priority(), entry.sequence, entry.job.id()});
}

void Scheduler::ChangedLocked(Entry& entry) { ++entry.version; }

void Scheduler::UpdateGaugesLocked() {
  if (metrics_ == nullptr) return;
  metrics_->SetQueueState(static_cast<int>(queue_.size()), running_);
  metrics_->SetMemory(options_.memory_budget, reserved_);
}

Scheduler::Entry* Scheduler::FindLocked(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

Scheduler::Snapshot Scheduler::FinishLocked(Entry& entry, v1::JobState state,
                                            const absl::Status& status) {
  entry.job.set_state(state);
  entry.job.set_finished_unix(NowUnix());
  if (!status.ok()) SetError(entry.job, status);
  ChangedLocked(entry);
  if (metrics_ != nullptr) RecordJobEnd(entry.job, state, *metrics_);
  return SnapshotLocked(entry);
}

std::vector<Scheduler::Deletion> Scheduler::PruneLocked() {
  const double horizon = NowUnix() - absl::ToDoubleSeconds(options_.retention);
  std::vector<std::string> expired;
  for (const auto& [id, entry] : jobs_) {
    if (IsTerminal(entry->job.state()) && entry->job.finished_unix() < horizon &&
        entry->context == nullptr && entry->waiters == 0) {
      expired.push_back(id);
    }
  }
  std::vector<Deletion> deletions;
  for (const std::string& id : expired) {
    Entry& entry = *jobs_[id];
    if (!entry.job.idempotency_key().empty()) {
      by_key_.erase({entry.job.owner(), entry.job.idempotency_key()});
    }
    deletions.emplace_back(entry.record, id);
    jobs_.erase(id);
  }
  return deletions;
}

absl::StatusOr<v1::Job> Scheduler::Submit(const v1::JobSpec& spec,
                                          const std::string& idempotency_key,
                                          const std::string& owner) {
  const uint64_t reservation = std::max<uint64_t>(spec.memory_budget(), estimator_(spec));
  Snapshot created;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(created, AdmitLocked(spec, idempotency_key, owner, reservation));
    if (created.slot == nullptr) return created.job;  // the existing job for this key
  }
  // Recorded before it can start: the entry is queued only once the record is durable.
  absl::Status persisted = Write(created);
  absl::MutexLock lock(&mu_);
  --recording_;
  Entry* entry = FindLocked(created.job.id());
  if (!persisted.ok()) {
    // Unless it already changed (cancelled meanwhile), the job never existed.
    if (entry != nullptr && entry->snapshots == created.sequence) {
      by_key_.erase({owner, idempotency_key});
      jobs_.erase(created.job.id());
    }
    return Annotate(persisted, "recording the job");
  }
  if (entry == nullptr) return created.job;
  if (entry->job.state() == v1::JOB_STATE_QUEUED) EnqueueLocked(*entry);
  if (metrics_ != nullptr) metrics_->JobSubmitted(JobKindLabel(spec.kind()));
  UpdateGaugesLocked();
  return entry->job;
}

absl::StatusOr<Scheduler::Snapshot> Scheduler::AdmitLocked(const v1::JobSpec& spec,
                                                           const std::string& idempotency_key,
                                                           const std::string& owner,
                                                           uint64_t reservation) {
  if (!accepting_) return absl::UnavailableError("the daemon is shutting down; not accepting jobs");
  if (!idempotency_key.empty()) {
    auto it = by_key_.find({owner, idempotency_key});
    if (it != by_key_.end()) {
      Entry* existing = FindLocked(it->second);
      if (existing != nullptr) {
        if (google::protobuf::util::MessageDifferencer::Equals(existing->job.spec(), spec)) {
          return Snapshot{nullptr, 0, existing->job};
        }
        return absl::AlreadyExistsError(absl::StrCat("idempotency key \"", idempotency_key,
                                                     "\" was used for job ", existing->job.id(),
                                                     " with a different spec"));
      }
    }
  }
  if (reservation > options_.memory_budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the job needs ", reservation, " bytes of memory but the daemon's whole budget is ",
        options_.memory_budget, " bytes; lower --threads or the window, or raise --memory-budget"));
  }
  if (static_cast<int>(queue_.size()) + recording_ >= options_.max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the queue is full (", options_.max_queue, " jobs waiting); retry later"));
  }
  auto entry = std::make_unique<Entry>();
  entry->job.set_id(NewJobId());
  entry->job.set_idempotency_key(idempotency_key);
  entry->job.set_owner(owner);
  *entry->job.mutable_spec() = spec;
  entry->job.set_state(v1::JOB_STATE_QUEUED);
  entry->job.set_created_unix(NowUnix());
  entry->job.set_reserved_memory_bytes(reservation);
  entry->sequence = next_sequence_++;
  entry->reservation = reservation;
  Entry& e = *entry;
  jobs_[e.job.id()] = std::move(entry);
  if (!idempotency_key.empty()) by_key_[{owner, idempotency_key}] = e.job.id();
  ++recording_;  // counted against max_queue until queued
  return SnapshotLocked(e);
}

bool Scheduler::HasIdempotencyKey(const std::string& key, const std::string& owner) const {
  if (key.empty()) return false;
  absl::MutexLock lock(&mu_);
  return by_key_.contains({owner, key});
}

absl::StatusOr<v1::Job> Scheduler::Get(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Entry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  return entry->job;
}

absl::StatusOr<JobPage> Scheduler::List(const std::vector<v1::JobState>& states, int page_size,
                                        const std::string& page_token, const std::string* owner) {
  if (page_size < 0 || page_size > 1000) {
    return absl::InvalidArgumentError("page_size must be in [0, 1000]");
  }
  if (page_size == 0) page_size = 100;
  // Newest first: (created, sequence) descending. The token is the last job's position.
  int64_t after_sequence = INT64_MAX;
  if (!page_token.empty() && !absl::SimpleAtoi(page_token, &after_sequence)) {
    return absl::InvalidArgumentError("invalid page_token");
  }
  absl::MutexLock lock(&mu_);
  std::vector<const Entry*> matching;
  for (const auto& [id, entry] : jobs_) {
    if (entry->sequence >= after_sequence) continue;
    if (owner != nullptr && entry->job.owner() != *owner) continue;
    if (!states.empty() &&
        std::find(states.begin(), states.end(), entry->job.state()) == states.end()) {
      continue;
    }
    matching.push_back(entry.get());
  }
  std::sort(matching.begin(), matching.end(),
            [](const Entry* a, const Entry* b) { return a->sequence > b->sequence; });
  JobPage page;
  for (size_t i = 0; i < matching.size() && static_cast<int>(i) < page_size; ++i) {
    page.jobs.push_back(matching[i]->job);
  }
  if (static_cast<int>(matching.size()) > page_size) {
    page.next_page_token = absl::StrCat(matching[page_size - 1]->sequence);
  }
  return page;
}

absl::StatusOr<v1::Job> Scheduler::Cancel(const std::string& id) {
  std::vector<Snapshot> writes;
  absl::StatusOr<v1::Job> job = CancelInMemory(id, writes);
  PersistAll(writes, {});
  return job;
}

absl::StatusOr<v1::Job> Scheduler::CancelInMemory(const std::string& id,
                                                  std::vector<Snapshot>& writes) {
  absl::MutexLock lock(&mu_);
  Entry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  switch (entry->job.state()) {
    case v1::JOB_STATE_QUEUED:
      queue_.erase({-entry->job.spec().priority(), entry->sequence, entry->job.id()});
      writes.push_back(FinishLocked(*entry, v1::JOB_STATE_CANCELLED,
                                    absl::CancelledError("cancelled while queued")));
      UpdateGaugesLocked();
      break;
    case v1::JOB_STATE_RUNNING:
      if (entry->context != nullptr) entry->context->cancelled.store(true);
      entry->job.set_note("cancel requested; stopping at the next window");
      ChangedLocked(*entry);
      break;
    default:
      break;  // already finished
  }
  return entry->job;
}

absl::StatusOr<v1::Job> Scheduler::WaitForChange(const std::string& id, int64_t* version,
                                                 absl::Duration timeout) {
  struct Args {
    Scheduler* self;
    const Entry* entry;
    int64_t version;
  };
  absl::MutexLock lock(&mu_);
  Entry* entry = FindLocked(id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job \"", id, "\""));
  Args args{this, entry, *version};
  ++entry->waiters;  // keeps PruneLocked from freeing the entry while we wait on it
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                             return a->entry->version > a->version ||
                                    IsTerminal(a->entry->job.state()) || a->self->stopping_;
                           },
                           &args),
                       timeout);
  --entry->waiters;
  *version = entry->version;
  return entry->job;
}

bool Scheduler::CanStartLocked() const {
  if (stopping_) return true;
  // While draining for shutdown, queued jobs stay queued for the next start.
  if (!accepting_ || queue_.empty() || running_ >= options_.max_concurrent_jobs) return false;
  const auto& head = std::get<2>(*queue_.begin());
  auto it = jobs_.find(head);
  return it != jobs_.end() && reserved_ + it->second->reservation <= options_.memory_budget;
}

void Scheduler::WorkerLoop() {
  while (true) {
    mu_.LockWhen(absl::Condition(this, &Scheduler::CanStartLocked));
    if (stopping_) {
      mu_.Unlock();
      return;
    }
    const std::string id = std::get<2>(*queue_.begin());
    queue_.erase(queue_.begin());
    ++busy_workers_;
    Entry& entry = *jobs_[id];
    auto context = std::make_shared<JobContext>();
    const bool resume = entry.job.attempts() > 0;
    context->resume = resume;
    // A resumed attempt finds the files the last one finished in the output's own records
    // (lib/engine/output_commit.h); the job keeps listing them until they are written again.
    if (!resume) entry.job.clear_committed_files();
    entry.context = context;
    entry.job.set_state(v1::JOB_STATE_RUNNING);
    entry.job.set_attempts(entry.job.attempts() + 1);
    entry.job.set_started_unix(NowUnix());
    entry.job.set_peak_rss_bytes(ResidentBytes());
    if (!resume) entry.job.clear_note();
    reserved_ += entry.reservation;
    ++running_;
    entry.bytes_counted = 0;
    const Snapshot started = SnapshotLocked(entry);
    ChangedLocked(entry);
    UpdateGaugesLocked();

    Entry* entry_ptr = &entry;
    // Called under the engine's progress lock: only updates memory; PersistLoop writes.
    context->on_progress = [this, entry_ptr](const Progress& p) {
      absl::MutexLock lock(&mu_);
      if (entry_ptr->abandoned) return;
      SetJobProgress(p, entry_ptr->job);
      if (metrics_ != nullptr && p.bytes_done > entry_ptr->bytes_counted) {
        // Counted as windows are written, so throughput shows while the job runs.
        metrics_->AddBytes(0, p.bytes_done - entry_ptr->bytes_counted);
        entry_ptr->bytes_counted = p.bytes_done;
      }
      const absl::Time now = absl::Now();
      if (now - entry_ptr->last_progress_bump >= absl::Milliseconds(200) ||
          p.bytes_done == p.bytes_total) {
        entry_ptr->last_progress_bump = now;
        // The daemon's resident memory, sampled while the job runs (shared by concurrent jobs).
        entry_ptr->job.set_peak_rss_bytes(
            std::max<uint64_t>(entry_ptr->job.peak_rss_bytes(), ResidentBytes()));
        ChangedLocked(*entry_ptr);
      }
      dirty_.insert(entry_ptr->job.id());
    };
    context->on_file_committed = [this, entry_ptr](const WrittenFile& file) {
      Snapshot committed;
      {
        absl::MutexLock lock(&mu_);
        if (entry_ptr->abandoned) return;
        SetOutputFile(file, *entry_ptr->job.add_committed_files());
        committed = SnapshotLocked(*entry_ptr);
      }
      Persist(committed);  // durable on return: a crash after this point keeps the file
    };
    mu_.Unlock();

    Persist(started);
    absl::StatusOr<ConversionResult> result = runner_(started.job, *context);

    mu_.Lock();
    reserved_ -= entry.reservation;
    --running_;
    entry.context.reset();
    if (entry.abandoned) {
      // Shutdown recorded this job and returned without this worker.
      --busy_workers_;
      UpdateGaugesLocked();
      mu_.Unlock();
      return;
    }
    // The end is prepared on a copy and shown only once it is durable, so no one sees an
    // end the store could still lose.
    Entry draft = entry;
    Snapshot end;
    if (result.ok()) {
      SetJobResult(*result, draft.job);
      if (metrics_ != nullptr) RecordJobResult(draft.job, *result, draft.bytes_counted, *metrics_);
      end = (FinishLocked(draft, v1::JOB_STATE_SUCCEEDED, absl::OkStatus()));
    } else if (context->preserve_staging.load()) {
      // Interrupted by shutdown: queued again to resume at the next start.
      draft.job.set_state(v1::JOB_STATE_QUEUED);
      draft.job.set_note("interrupted by daemon shutdown; will resume at the next start");
      end = (SnapshotLocked(draft));
      ChangedLocked(draft);
    } else if (absl::IsCancelled(result.status()) && context->cancelled.load()) {
      end = (FinishLocked(draft, v1::JOB_STATE_CANCELLED, result.status()));
    } else {
      end = (FinishLocked(draft, v1::JOB_STATE_FAILED, result.status()));
    }
    UpdateGaugesLocked();
    mu_.Unlock();
    const absl::Status persisted = Write(end);
    mu_.Lock();
    entry.job = std::move(draft.job);
    entry.snapshots = draft.snapshots;
    entry.bytes_counted = draft.bytes_counted;
    if (!persisted.ok()) NotePersistFailure(entry.job, persisted);
    ChangedLocked(entry);
    const std::vector<Deletion> deletions = PruneLocked();
    --busy_workers_;
    mu_.Unlock();
    PersistAll({}, deletions);
  }
}

void Scheduler::StopAccepting() {
  absl::MutexLock lock(&mu_);
  accepting_ = false;
}

bool Scheduler::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool Scheduler::accepting() const {
  absl::MutexLock lock(&mu_);
  return accepting_;
}

bool Scheduler::CanStartNextForTesting() const {
  absl::MutexLock lock(&mu_);
  return CanStartLocked();
}

int Scheduler::WaitersForTesting(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? 0 : it->second->waiters;
}

uint64_t Scheduler::reserved_bytes() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

absl::StatusOr<std::unique_ptr<MemoryReservation>> Scheduler::ReserveNow(uint64_t bytes,
                                                                         absl::string_view what) {
  absl::MutexLock lock(&mu_);
  if (reserved_ + bytes > options_.memory_budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", bytes, " bytes of the daemon's memory budget for metadata, but only ",
        options_.memory_budget - std::min(reserved_, options_.memory_budget), " of its ",
        options_.memory_budget, " bytes (--memory-budget) are free; retry when jobs finish"));
  }
  reserved_ += bytes;
  UpdateGaugesLocked();
  return std::unique_ptr<MemoryReservation>(new MemoryReservation(this, bytes));
}

void Scheduler::Unreserve(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_ -= bytes;
  UpdateGaugesLocked();
}

MemoryReservation::~MemoryReservation() { scheduler_->Unreserve(bytes_); }

int Scheduler::Shutdown(absl::Duration grace) {
  std::vector<Snapshot> writes;
  int abandoned = 0;
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
    if (shutdown_started_) return abandoned_;
    shutdown_started_ = true;
    // Idle: no worker runs a job or is still recording its end.
    auto idle = [](Scheduler* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->busy_workers_ == 0; };
    mu_.AwaitWithTimeout(absl::Condition(+idle, this), grace);
    for (auto& [id, entry] : jobs_) {
      // A job already being cancelled at the user's request stays cancelled (its staging is
      // removed); only the others are interrupted to resume at the next start.
      if (entry->context != nullptr && !entry->context->cancelled.load()) {
        entry->context->preserve_staging.store(true);
        entry->context->cancelled.store(true);
      }
    }
    if (!mu_.AwaitWithTimeout(absl::Condition(+idle, this), options_.interrupt_wait)) {
      // Some runner ignores the interruption (e.g. blocked in a system call). Record its job
      // as the worker would have, and stop waiting for it.
      for (auto& [id, entry] : jobs_) {
        if (entry->context == nullptr || entry->abandoned) continue;
        entry->abandoned = true;
        ++abandoned_;
        if (entry->context->preserve_staging.load()) {
          entry->job.set_state(v1::JOB_STATE_QUEUED);
          entry->job.set_note(
              absl::StrCat("the daemon stopped while attempt ", entry->job.attempts(),
                           " did not respond to the interruption; will resume at the next start"));
          writes.push_back(SnapshotLocked(*entry));
          ChangedLocked(*entry);
        } else {
          writes.push_back(FinishLocked(
              *entry, v1::JOB_STATE_CANCELLED,
              absl::CancelledError("cancelled; the daemon stopped before the job did (its "
                                   "staging folder may remain)")));
        }
      }
      // The workers that did return may still be recording their jobs' ends.
      auto recorded = [](Scheduler* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return s->busy_workers_ <= s->abandoned_;
      };
      mu_.AwaitWithTimeout(absl::Condition(+recorded, this), options_.interrupt_wait);
    }
    stopping_ = true;
    abandoned = abandoned_;
  }
  PersistAll(writes, {});
  if (persister_.joinable()) persister_.join();
  if (abandoned == 0) {
    // Every worker returns now that stopping_ is set; abandoned ones are joined by the
    // destructor.
    for (std::thread& worker : workers_) worker.join();
    workers_.clear();
  }
  return abandoned;
}

}  // namespace reshard
