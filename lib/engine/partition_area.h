// The shared area of a partitioned conversion (lib/engine/partitioned_conversion.h) on any
// kvstore::Driver: where it lives, its small files (split.json, the partitions' records, the
// claims) and the claims' leases. Everything here goes through the driver, so posix, S3 and
// memory run the same code.
//
// The area is the sibling prefix `<parent>/.<name>.reshard-partitions/` of output
// `<parent>/<name>` (posix: a folder; S3 and memory: a key prefix), so that it is never
// inside the output and a listing of the output does not see it. It holds:
//
//   split.json                        the conversion and K; created once, never replaced
//   partition-IIIII-of-KKKKK.json     worker I's record: its files' names, sizes and XXH3-64
//   partition-IIIII-of-KKKKK.claim    the worker writing partition I now, with its lease
//   partition-IIIII-of-KKKKK.claim.taken-<H>
//                                     who took over the stale claim whose bytes hash to H
//   publish.claim                     who publishes
//   data/                             (posix only) the output folder being assembled
//
// Claims. A worker holds partition I by creating its claim with Driver::CreateExclusive (S3:
// PUT with If-None-Match: *). The claim holds who holds it (host, boot id, pid namespace, pid,
// process start time, a random token) and its lease: `expires`, a time on the holder's clock,
// and `heartbeat`, a counter. The holder rewrites the claim every ClaimOptions::refresh with
// the counter one higher and the expiry a lease later; it stops holding the claim when it
// finds another token there (Held). A claim is live while its holder can be seen running (same
// host, boot and pid namespace: its pid belongs to a process started at the recorded time) or,
// for a holder elsewhere, until its expiry has passed on the reader's clock: the workers'
// clocks are taken to agree to well within the lease. A claim that is not live is stale and is
// taken over by conditional replace: the taker creates the `.taken-<H>` marker of the bytes
// it read with CreateExclusive (of several takers exactly one succeeds; the others stop with
// FailedPrecondition), checks that the claim's generation (PathStat::generation: S3's ETag)
// is still the one it read (a holder that refreshed meanwhile is live), then deletes it and
// creates its own with CreateExclusive. A holder that rewrites its claim at the moment it is
// taken over can overwrite the taker's: then the taker finds a foreign token at its next
// refresh and stops; the files both wrote are the same bytes.

#ifndef RESHARD_LIB_ENGINE_PARTITION_AREA_H_
#define RESHARD_LIB_ENGINE_PARTITION_AREA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lib/io/kvstore/driver.h"
#include "lib/plan/layout.h"
#include "nlohmann/json.hpp"

namespace reshard {

inline constexpr char kSplitName[] = "split.json";
inline constexpr char kPublishClaimName[] = "publish.claim";
// The folder of a posix area where the output is assembled before its rename.
inline constexpr char kAreaDataName[] = "data";

// Where the area of one output lives.
struct PartitionArea {
  const kvstore::Driver* driver = nullptr;
  // The output as every worker spells it (no trailing '/'), and the folder or prefix holding it
  // and its name in there.
  std::string output;
  std::string parent;
  std::string name;
  // The area's path: `<parent>/.<name>.reshard-partitions`.
  std::string root;

  std::string PathOf(absl::string_view file) const;
};

// The area of output `output`. InvalidArgument when the output has no name to put a sibling
// beside (a whole bucket, a path ending in "..").
absl::StatusOr<PartitionArea> LocatePartitionArea(const std::string& output);

// Removes the area and everything in it (best effort: the output is published by then).
void RemovePartitionArea(const PartitionArea& area);

// The contents of small file `path` (a record, split.json, a claim, a manifest) and the Stat
// it was read at: NotFound when absent, DataLoss naming it when it is larger than any of
// reshard's.
absl::StatusOr<std::pair<std::string, kvstore::PathStat>> ReadSmallFile(
    const kvstore::Driver& driver, const std::string& path);
// The same, parsed: DataLoss naming it when it is not a JSON object.
absl::StatusOr<nlohmann::ordered_json> ReadJsonFile(const kvstore::Driver& driver,
                                                    const std::string& path);

// Field `key` of `json` as a T, or `fallback` when `json` is not an object, lacks the key or
// holds another type there: area files may hold anything.
template <typename T>
T FieldOr(const nlohmann::ordered_json& json, const char* key, T fallback) {
  if (!json.is_object()) return fallback;
  auto it = json.find(key);
  if (it == json.end()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}

std::string Hex16(uint64_t value);
std::string PartitionRecordName(int index, int count);
std::string PartitionClaimName(int index, int count);
// What to run to write partition `index` again, for error messages.
std::string RerunHint(int index, int count);

// split.json: the request, K and the plan's data files. Its XXH3-64 is the split's identity.
struct Split {
  nlohmann::ordered_json json;
  std::string id;
  int count = 0;
};
Split MakeSplit(nlohmann::ordered_json request, int count, const CopyPlan& plan);

// Creates split.json, or checks that the one there is this split: FailedPrecondition
// describing both splits otherwise.
absl::Status JoinSplit(const PartitionArea& area, const Split& split);

// A partition's record: file name -> (bytes, XXH3-64).
using RecordedFiles = std::map<std::string, std::pair<uint64_t, uint64_t>>;

// Writes partition `index`'s record, replacing an older one.
absl::Status WritePartitionRecord(const PartitionArea& area, const Split& split, int index,
                                  const RecordedFiles& files);
// Reads partition `index`'s record: NotFound when absent, DataLoss naming the file and what
// to rerun when it is not this split's record of that partition.
absl::StatusOr<RecordedFiles> ReadPartitionRecord(const PartitionArea& area, const Split& split,
                                                  int index);

// How claims are held and judged; tests drive the clock.
struct ClaimOptions {
  // How long a claim of a holder elsewhere stays live after its last refresh.
  absl::Duration lease = absl::Seconds(120);
  // How often the holder refreshes its claim.
  absl::Duration refresh = absl::Seconds(30);
  // The clock of `expires`, the holder's when writing and the reader's when judging.
  std::function<absl::Time()> now = [] { return absl::Now(); };
  // Who this process is (ThisProcess()); tests pose as a worker on another host.
  nlohmann::ordered_json identity;
  // Called once a claim is judged stale, before it is taken over: tests line racing takers
  // up there.
  std::function<void()> on_stale;
};

// What tells this process apart from every other: pid, host and, for a check by pid, the
// boot, the pid namespace and the process's start time.
nlohmann::ordered_json ThisProcess();

// A worker's hold on its partition index (see above). Released (deleted while still this
// worker's) when destroyed.
class PartitionClaim {
 public:
  // Creates the claim of partition `index` of `count`, or takes a stale one over.
  // FailedPrecondition naming the holder when the claim is live or another worker took the
  // stale one over first.
  static absl::StatusOr<std::unique_ptr<PartitionClaim>> Acquire(const PartitionArea& area,
                                                                 int index, int count,
                                                                 ClaimOptions options = {});

  PartitionClaim(const PartitionClaim&) = delete;
  PartitionClaim& operator=(const PartitionClaim&) = delete;
  ~PartitionClaim();

  // Rewrites the claim with the next heartbeat and a fresh expiry (the refresher thread calls
  // this every ClaimOptions::refresh). FailedPrecondition, from then on from Held too, when
  // the claim holds another worker's token.
  absl::Status Refresh();

  // FailedPrecondition when another worker has taken the claim over (this one was judged
  // gone: stalled past the lease).
  absl::Status Held() const;

  // The claim's path.
  const std::string& path() const { return path_; }

 private:
  PartitionClaim(const PartitionArea& area, std::string path, nlohmann::ordered_json contents,
                 ClaimOptions options);
  void RefreshLoop();
  std::string Text() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LostStatus() const;

  const kvstore::Driver& driver_;
  const std::string path_;
  const std::string token_;
  const ClaimOptions options_;
  mutable absl::Mutex mu_;
  nlohmann::ordered_json contents_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::thread refresher_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_PARTITION_AREA_H_
