// An in-memory RemoteStore for tests of the code above the stores (MappedFile's remote mode,
// file_access's dispatch, SpanReader's whole spans), which must not need a server. The S3
// store itself is tested against radosgw (lib/io/s3/s3_store_rgw_test.cc).

#ifndef RESHARD_LIB_IO_TESTING_MEMORY_STORE_H_
#define RESHARD_LIB_IO_TESTING_MEMORY_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/io/remote_store.h"

namespace reshard {

// Files by full URL ("mem://b/f"); a folder is any prefix followed by '/'. Every Put makes a
// new version of its file (an ETag-like "\"v7\"", one counter for the store), which Stat and
// the listings give, and ReadRange refuses a read of another version than the current one
// (FailedPrecondition naming the file, both versions and the offset), as S3's If-Match does.
// Thread safe.
class MemoryStore : public RemoteStore {
 public:
  void Put(const std::string& url, std::string data);
  // The current version of file `url`; empty when there is none.
  std::string version(const std::string& url) const;
  // ReadRange of `url` fails with `error` from now on.
  void Fail(const std::string& url, absl::Status error);
  // Stat, List and ListEntries of `url` fail with `error` from now on (a store answering 503
  // to the requests that look a path up).
  void FailLookups(const std::string& url, absl::Status error);

  // Every file whose URL starts with `prefix`, removed.
  void RemovePrefix(const std::string& prefix);

  // Requests served so far, and the ranges read (offset, length) in the order they came.
  int reads() const;
  // Stat, List and ListEntries calls so far.
  int lookups() const;
  std::vector<std::pair<uint64_t, uint64_t>> ranges() const;

  // Every ReadRange waits `delay` (outside the store's lock) before it is served, as a request
  // waits its round trip: tests of reads in flight see them overlap (max_concurrent_reads) and
  // time what overlapping saves. Default: none.
  void set_read_delay(absl::Duration delay);
  // The most ReadRange calls under way at once since the store was made or last reset.
  int max_concurrent_reads() const;
  void reset_max_concurrent_reads();

  absl::StatusOr<RemoteStat> Stat(const std::string& url) override;
  absl::StatusOr<std::vector<RemoteEntry>> List(const std::string& url) override;
  absl::StatusOr<RemoteListing> ListEntries(const std::string& url) override;
  absl::Status ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                         const RemoteStat& opened) override;

 private:
  mutable absl::Mutex mu_;
  struct File {
    std::string data;
    std::string version;
  };
  std::map<std::string, File> files_ ABSL_GUARDED_BY(mu_);
  int puts_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, absl::Status> failures_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Status> lookup_failures_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> ranges_ ABSL_GUARDED_BY(mu_);
  int lookups_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration read_delay_ ABSL_GUARDED_BY(mu_);
  int reads_under_way_ ABSL_GUARDED_BY(mu_) = 0;
  int max_concurrent_reads_ ABSL_GUARDED_BY(mu_) = 0;
};

// One MemoryStore for URLs "mem://...", registered at the first call and shared by the tests of
// a binary (registered stores are never destroyed).
MemoryStore* SharedMemStore();

}  // namespace reshard

#endif  // RESHARD_LIB_IO_TESTING_MEMORY_STORE_H_
