// Reads of many small files (the per-rank metadata files of a training save) with several in
// flight, handed to the caller one at a time in index order.
//
// A layout with hundreds of ranks has hundreds of small files whose metadata must be parsed
// before anything is known. Read one after another from S3 each costs its round trips; here,
// once reads take `threads_after` (a round trip, a disk seek), up to `max_in_flight` of them are
// read at once on worker threads, while the calling thread takes the results in index order (so
// what it builds from them, file indices included, does not depend on which read finished
// first). What is read ahead of the caller is bounded in bytes (each result says how much memory
// it holds) and in count. The first failure in index order is returned: reads after a failed one
// are not started, and results after it are dropped. Quick reads (a local file in the page
// cache, ~0.1 ms) stay on the calling thread, where they cost less than threads would.
//
// Worker threads read under the calling thread's PathConfinement and MetadataAllowance. They
// have no ScopedRemoteListingCache (its cache belongs to the calling thread and is not thread
// safe): `read` must not count on one.

#ifndef RESHARD_LIB_FORMATS_PARALLEL_READS_H_
#define RESHARD_LIB_FORMATS_PARALLEL_READS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace reshard {

struct ParallelReadOptions {
  // Reads under way at once; 1 reads on the calling thread, one after another.
  int max_in_flight = 16;
  // Reads run on the calling thread, one after another, until `slow_reads_in_a_row` in a row
  // each take `threads_after`; the rest then run on worker threads.
  absl::Duration threads_after = absl::Milliseconds(2);
  int slow_reads_in_a_row = 3;
  // Results read but not yet taken (the one the caller is taking included), at most; and their
  // bytes, at most: a worker starts a read only when the results waiting plus the running reads,
  // each counted at the largest result seen so far, fit (one read is always allowed when nothing
  // waits). A result larger than all before it can pass the bound by what it adds.
  int max_ahead = 64;
  uint64_t max_bytes_ahead = uint64_t{16} << 20;
};

// Calls `read(i)` for i in [0, count) (on the calling thread while reads are quick, then on
// worker threads, several at once: `read` must be safe to call concurrently) and `take(i,
// result)` with each result on the calling thread, in index order. `read` returns the result
// and `bytes(result)` its memory. Returns the first error in index order, of `read` or `take`.
template <typename T, typename Read, typename Bytes, typename Take>
absl::Status ReadInOrder(int count, const ParallelReadOptions& options, Read read, Bytes bytes,
                         Take take);

class TorchArchive;
struct Catalog;

// The memory `catalog` holds, roughly (its tensors' names, shapes and pieces): what a
// ReadInOrder of catalogs counts ahead of the caller.
uint64_t CatalogBytes(const Catalog& catalog);

// Opens the torch.save archives at `paths` (TorchArchive::Open) with ReadInOrder and hands each
// to `take(i, archive)`, in order; an archive is dropped once taken. Counted at its parsed
// values' bytes (TorchArchive::metadata_bytes).
absl::Status OpenArchivesInOrder(const std::vector<std::string>& paths,
                                 absl::FunctionRef<absl::Status(int, const TorchArchive&)> take,
                                 const ParallelReadOptions& options = {});

namespace parallel_reads_internal {

// The scheduling of ReadInOrder without its types: `read(i)` stores its result where
// `take(i)` finds it and returns the result's bytes.
absl::Status ReadInOrder(int count, const ParallelReadOptions& options,
                         absl::FunctionRef<absl::StatusOr<uint64_t>(int)> read,
                         absl::FunctionRef<absl::Status(int)> take);

}  // namespace parallel_reads_internal

template <typename T, typename Read, typename Bytes, typename Take>
absl::Status ReadInOrder(int count, const ParallelReadOptions& options, Read read, Bytes bytes,
                         Take take) {
  // Slot i is written by the worker that reads i and read by the caller after that read is
  // reported done (ordered by the scheduler's mutex).
  std::vector<std::optional<T>> slots(count > 0 ? count : 0);
  return parallel_reads_internal::ReadInOrder(
      count, options,
      [&](int i) -> absl::StatusOr<uint64_t> {
        absl::StatusOr<T> result = read(i);
        if (!result.ok()) return result.status();
        const uint64_t size = bytes(*result);
        slots[i].emplace(*std::move(result));
        return size;
      },
      [&](int i) -> absl::Status {
        T result = *std::move(slots[i]);
        slots[i].reset();
        return take(i, std::move(result));
      });
}

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_PARALLEL_READS_H_
