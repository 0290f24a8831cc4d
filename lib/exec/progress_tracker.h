// The progress of an execution, shared by all its workers, reported to ExecutorOptions'
// callbacks one call at a time.

#ifndef RESHARD_LIB_EXEC_PROGRESS_TRACKER_H_
#define RESHARD_LIB_EXEC_PROGRESS_TRACKER_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lib/exec/executor_options.h"
#include "lib/plan/layout.h"

namespace reshard {

class ProgressTracker {
 public:
  ProgressTracker(const CopyPlan& plan, std::function<void(const Progress&)> callback)
      : callback_(std::move(callback)) {
    progress_.bytes_total = plan.total_bytes;
    progress_.files_total = static_cast<int>(plan.files.size());
    for (const FilePlan& file : plan.files) progress_.tensors_total += file.tensors.size();
  }

  void Add(uint64_t bytes, int64_t tensors, int files) {
    absl::MutexLock lock(&mu_);
    progress_.bytes_done += bytes;
    progress_.tensors_done += tensors;
    progress_.files_done += files;
    if (callback_) callback_(progress_);
  }

  // Serializes the per-file callback with progress reports.
  void Committed(const std::function<void(const WrittenFile&)>& callback, const WrittenFile& file) {
    absl::MutexLock lock(&mu_);
    if (callback) callback(file);
  }

 private:
  absl::Mutex mu_;
  Progress progress_ ABSL_GUARDED_BY(mu_);
  const std::function<void(const Progress&)> callback_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_PROGRESS_TRACKER_H_
