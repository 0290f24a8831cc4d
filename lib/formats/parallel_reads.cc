#include "lib/formats/parallel_reads.h"

#include <algorithm>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/core/catalog.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace parallel_reads_internal {
namespace {

// The state the workers and the calling thread share.
class Scheduler {
 public:
  // Reads [first, count) (first >= 1); `largest` is the largest result of the reads before.
  Scheduler(int count, int first, uint64_t largest, const ParallelReadOptions& options,
            absl::FunctionRef<absl::StatusOr<uint64_t>(int)> read)
      : count_(count),
        options_(options),
        read_(read),
        results_(count),
        next_(first),
        taken_(first),
        failed_at_(count),
        largest_(largest) {}

  // A worker: starts the next read while the bounds allow, until none is left.
  void Work() {
    absl::MutexLock lock(&mu_);
    while (true) {
      mu_.Await(absl::Condition(this, &Scheduler::CanStartOrDone));
      if (stopped_ || next_ >= std::min(count_, failed_at_)) return;
      const int index = next_++;
      ++running_;
      mu_.Unlock();
      absl::StatusOr<uint64_t> result = read_(index);
      mu_.Lock();
      --running_;
      if (result.ok()) {
        bytes_ahead_ += *result;
        largest_ = std::max(largest_, *result);
      } else {
        failed_at_ = std::min(failed_at_, index);
      }
      results_[index] = std::move(result);
    }
  }

  // Waits for read `index` (the next in order); its status.
  absl::Status Await(int index) {
    absl::MutexLock lock(&mu_);
    auto done = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return results_[index].has_value();
    };
    mu_.Await(absl::Condition(&done));
    return results_[index]->status();
  }

  // The caller is done with result `index` (Await gave it OK): its bytes are free.
  void Taken(int index) {
    absl::MutexLock lock(&mu_);
    bytes_ahead_ -= **results_[index];
    results_[index].reset();
    taken_ = index + 1;
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

 private:
  bool CanStartOrDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopped_ || next_ >= std::min(count_, failed_at_)) return true;
    const int ahead = next_ - taken_;  // started and not taken
    if (ahead == 0) return true;       // the caller waits for this one
    if (ahead >= options_.max_ahead || running_ >= options_.max_in_flight) return false;
    return bytes_ahead_ + (static_cast<uint64_t>(running_) + 1) * largest_ <=
           options_.max_bytes_ahead;
  }

  const int count_;
  const ParallelReadOptions options_;
  const absl::FunctionRef<absl::StatusOr<uint64_t>(int)> read_;

  absl::Mutex mu_;
  std::vector<std::optional<absl::StatusOr<uint64_t>>> results_ ABSL_GUARDED_BY(mu_);
  int next_ ABSL_GUARDED_BY(mu_);           // the next read to start
  int taken_ ABSL_GUARDED_BY(mu_);          // reads taken by the caller
  int running_ ABSL_GUARDED_BY(mu_) = 0;    // reads under way
  int failed_at_ ABSL_GUARDED_BY(mu_);      // the lowest failed read, or count_
  uint64_t bytes_ahead_ ABSL_GUARDED_BY(mu_) = 0;  // of results done and not taken
  uint64_t largest_ ABSL_GUARDED_BY(mu_);          // the largest result so far
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::Status ReadInOrder(int count, const ParallelReadOptions& options,
                         absl::FunctionRef<absl::StatusOr<uint64_t>(int)> read,
                         absl::FunctionRef<absl::Status(int)> take) {
  // On the calling thread while the reads are quick. A quick read can be slow once (the thread
  // lost its core meanwhile, on a loaded machine), several in a row are not.
  int first = 0;
  uint64_t largest = 0;
  int slow_in_a_row = 0;
  while (first < count) {
    const absl::Time start = absl::Now();
    absl::StatusOr<uint64_t> result = read(first);
    slow_in_a_row = absl::Now() - start >= options.threads_after ? slow_in_a_row + 1 : 0;
    if (!result.ok()) return result.status();
    largest = std::max(largest, *result);
    if (absl::Status taken = take(first); !taken.ok()) return taken;
    ++first;
    if (slow_in_a_row >= options.slow_reads_in_a_row && options.max_in_flight > 1) break;
  }
  if (first >= count) return absl::OkStatus();
  const int workers = std::min(count - first, options.max_in_flight);
  Scheduler scheduler(count, first, largest, options, read);
  const PathConfinement* confinement = CurrentPathConfinement();
  std::shared_ptr<MetadataAllowance> allowance = CurrentMetadataAllowance();
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&scheduler, confinement, allowance] {
      ScopedPathConfinement confined(confinement);
      ScopedMetadataAllowance charged(allowance);
      scheduler.Work();
    });
  }
  absl::Status status;
  for (int i = first; i < count && status.ok(); ++i) {
    status = scheduler.Await(i);
    if (!status.ok()) break;
    status = take(i);
    scheduler.Taken(i);
  }
  scheduler.Stop();
  for (std::thread& thread : threads) thread.join();
  return status;
}

}  // namespace parallel_reads_internal

uint64_t CatalogBytes(const Catalog& catalog) {
  uint64_t bytes = sizeof(catalog);
  for (const CatalogTensor& tensor : catalog.tensors) {
    bytes += sizeof(tensor) + tensor.name.size() + tensor.shape.size() * sizeof(int64_t) +
             (tensor.pieces.size() + tensor.replicas.size()) * sizeof(SourcePiece);
  }
  return bytes;
}

absl::Status OpenArchivesInOrder(const std::vector<std::string>& paths,
                                 absl::FunctionRef<absl::Status(int, const TorchArchive&)> take,
                                 const ParallelReadOptions& options) {
  return ReadInOrder<std::unique_ptr<TorchArchive>>(
      static_cast<int>(paths.size()), options,
      [&](int i) { return TorchArchive::Open(paths[i]); },
      [](const std::unique_ptr<TorchArchive>& archive) { return archive->metadata_bytes(); },
      [&](int i, std::unique_ptr<TorchArchive> archive) { return take(i, *archive); });
}

}  // namespace reshard
