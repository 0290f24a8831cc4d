// The job store: every job the daemon knows, persisted in SQLite under --state-dir so that
// a restart finds them all. Rows hold the serialized reshard.v1.Job plus indexed columns.
// Writes are durable (WAL, synchronous=FULL) before the call returns. Thread safe.

#ifndef RESHARD_SERVER_JOB_STORE_H_
#define RESHARD_SERVER_JOB_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/reshard/v1/reshard.pb.h"

struct sqlite3;

namespace reshard {

class JobStore {
 public:
  // Opens (creating if needed) `<state_dir>/jobs.sqlite3`.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& state_dir);
  ~JobStore();

  // Inserts or replaces the job with its id.
  absl::Status Put(const v1::Job& job);
  absl::StatusOr<std::vector<v1::Job>> LoadAll();
  absl::Status Delete(const std::string& id);

  // Tests only: runs before every Put, outside the store's lock (e.g. to make some writes
  // slow like a congested disk's fsync). Set before the store is shared.
  void SetPutHookForTesting(std::function<void(const v1::Job&)> hook) {
    put_hook_ = std::move(hook);
  }

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  std::function<void(const v1::Job&)> put_hook_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_JOB_STORE_H_
