// The memory driver: files held in the process, by full URL ("mem://b/f"). Paths "mem://..."
// reach the process's instance (GetMemoryDriver) in production as in tests; tests of the code
// above the drivers (MappedFile's reads, file_access's dispatch, the executor's reads in flight)
// use it instead of a server, with its hooks: failures injected per path, a delay on every
// read, and counters of the requests served.
//
// A folder is any prefix followed by '/'. Every Put (and every Write or CreateExclusive) makes
// a new version of its file (an ETag-like "\"v7\"", one counter per driver), which Stat and
// List give (Stat as its generation too), and ReadRange refuses a read of another version than the current one
// (FailedPrecondition naming the file, both versions and the offset), as S3's If-Match does.
// Thread safe.

#ifndef RESHARD_LIB_IO_KVSTORE_MEMORY_DRIVER_H_
#define RESHARD_LIB_IO_KVSTORE_MEMORY_DRIVER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/io/kvstore/driver.h"

namespace reshard {
namespace kvstore {

class MemoryDriver final : public Driver {
 public:
  // For paths "`scheme`://..." (registered with RegisterDriver by whoever makes it).
  explicit MemoryDriver(std::string scheme = "mem") : scheme_(std::move(scheme)) {}

  // Stores `data` as file `url` (a new version).
  void Put(const std::string& url, std::string data);
  // The current version of file `url`; empty when there is none.
  std::string version(const std::string& url) const;
  // ReadRange of `url` fails with `error` from now on.
  void Fail(const std::string& url, absl::Status error);
  // Stat and List of `url` fail with `error` from now on (a store answering 503 to the
  // requests that look a path up).
  void FailLookups(const std::string& url, absl::Status error);
  // Every file whose URL starts with `prefix`, removed.
  void RemovePrefix(const std::string& prefix);

  // ReadRange calls so far, and the ranges read (offset, length) in the order they came.
  int reads() const;
  std::vector<std::pair<uint64_t, uint64_t>> ranges() const;
  // Stat and List calls so far.
  int lookups() const;

  // Every ReadRange waits `delay` (outside the driver's lock) before it is served, as a
  // request waits its round trip: tests of reads in flight see them overlap
  // (max_concurrent_reads) and time what overlapping saves. Default: none.
  void set_read_delay(absl::Duration delay);
  // The most ReadRange calls under way at once since the driver was made or last reset.
  int max_concurrent_reads() const;
  void reset_max_concurrent_reads();

  absl::string_view scheme() const override { return scheme_; }
  absl::StatusOr<PathStat> Stat(const std::string& url) const override;
  absl::StatusOr<Listing> List(const std::string& url) const override;
  absl::Status ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                         const PathStat& opened) const override;
  absl::Status CreateExclusive(const std::string& url, absl::string_view bytes) const override;
  // The file is stored at Commit, whole.
  absl::StatusOr<std::unique_ptr<Writer>> Write(const std::string& url,
                                                const WriteOptions& options) const override;
  // The whole file, held until Commit.
  uint64_t WriteMemoryBound(const WriteOptions& options) const override {
    return options.size_hint;
  }
  absl::Status Delete(const std::string& url) const override;

 private:
  struct File {
    std::string data;
    std::string version;
  };
  // Stores `data` as `url` under the lock; returns its version.
  std::string PutLocked(const std::string& url, std::string data) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The injected lookup failure of `url`, or OK; counts the lookup.
  absl::Status LookupLocked(const std::string& url) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  friend class MemoryWriter;
  const std::string scheme_;
  mutable absl::Mutex mu_;
  mutable std::map<std::string, File> files_ ABSL_GUARDED_BY(mu_);
  mutable int puts_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> lookup_failures_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::pair<uint64_t, uint64_t>> ranges_ ABSL_GUARDED_BY(mu_);
  mutable int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration read_delay_ ABSL_GUARDED_BY(mu_);
  mutable int reads_under_way_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int max_concurrent_reads_ ABSL_GUARDED_BY(mu_) = 0;
};

// The process's driver for "mem://" paths (ParseLocation's), made at the first call.
MemoryDriver& GetMemoryDriver();

}  // namespace kvstore
}  // namespace reshard

#endif  // RESHARD_LIB_IO_KVSTORE_MEMORY_DRIVER_H_
