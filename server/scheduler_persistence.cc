// The Scheduler's persistence: job records written to the JobStore, at once when a job
// changes state and every persist_interval while it makes progress (PersistLoop), newer copies
// never overwritten by older ones.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "server/scheduler.h"

namespace reshard {

void Scheduler::NotePersistFailure(v1::Job& job, const absl::Status& status) {
  job.set_note(absl::StrCat("could not persist the job: ", status.message()));
}

Scheduler::Snapshot Scheduler::SnapshotLocked(Entry& entry) {
  entry.last_persist = absl::Now();
  dirty_.erase(entry.job.id());
  return Snapshot{entry.record, ++entry.snapshots, entry.job};
}

absl::Status Scheduler::Write(const Snapshot& snapshot) {
  absl::MutexLock lock(&snapshot.slot->mu);
  // A newer copy got here first (e.g. the persister's progress, or a finish).
  if (snapshot.sequence <= snapshot.slot->written) return absl::OkStatus();
  RETURN_IF_ERROR(store_->Put(snapshot.job));
  snapshot.slot->written = snapshot.sequence;
  return absl::OkStatus();
}

void Scheduler::Persist(const Snapshot& snapshot) {
  absl::Status status = Write(snapshot);
  if (status.ok()) return;
  absl::MutexLock lock(&mu_);
  Entry* entry = FindLocked(snapshot.job.id());
  if (entry != nullptr) {
    NotePersistFailure(entry->job, status);
    ChangedLocked(*entry);
  }
}

void Scheduler::PersistAll(const std::vector<Snapshot>& snapshots,
                           const std::vector<Deletion>& deletions) {
  for (const Snapshot& snapshot : snapshots) Persist(snapshot);
  for (const auto& [slot, id] : deletions) {
    absl::MutexLock lock(&slot->mu);
    slot->written = INT64_MAX;         // a copy still in flight must not bring the row back
    store_->Delete(id).IgnoreError();  // retried at the next prune if it failed
  }
}

void Scheduler::PersistLoop() {
  // Due jobs are looked for a few times per interval, so a write is at most ~25% late.
  const absl::Duration tick =
      std::clamp(options_.persist_interval / 4, absl::Milliseconds(5), absl::Milliseconds(250));
  while (true) {
    std::vector<Snapshot> writes;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [](Scheduler* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(+stop, this), tick);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      std::vector<Entry*> due;
      for (const std::string& id : dirty_) {
        Entry* entry = FindLocked(id);
        if (entry != nullptr && now - entry->last_persist >= options_.persist_interval) {
          due.push_back(entry);
        }
      }
      for (Entry* entry : due) writes.push_back(SnapshotLocked(*entry));  // erases from dirty_
    }
    PersistAll(writes, {});
  }
}

}  // namespace reshard
