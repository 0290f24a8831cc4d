// Which part of a conversion one worker of a partitioned job does (`--partition I/K`).
//
// A conversion split into K partitions is run by K cooperating workers (Slurm array tasks,
// Kubernetes Indexed Job pods, one reshardd job per node). The split is by output file: the
// plan's data files are dealt to K partitions balanced by bytes, deterministically from the plan
// alone, so every worker computes the same assignment without talking to the others.

#ifndef RESHARD_LIB_ENGINE_PARTITION_SPEC_H_
#define RESHARD_LIB_ENGINE_PARTITION_SPEC_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/plan/layout.h"

namespace reshard {

// At most this many partitions (and workers) per conversion.
inline constexpr int kMaxPartitions = 4096;

struct PartitionId {
  int index = 0;  // 0-based
  int count = 0;  // 0: not partitioned
};

// Looks up an environment variable: null when unset (std::getenv by default; tests pass their
// own).
using PartitionEnvLookup = std::function<const char*(const char*)>;

// Parses `--partition`:
//   "I/K"     worker I (0-based) of K
//   "auto"    from the engine that started this process: a Slurm array task
//             (SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT; the array must be 0..K-1; a task
//             of an `srun -n N` step inside array task T is partition T*N + SLURM_PROCID of
//             K*N), a task of an srun step (SLURM_PROCID of SLURM_NTASKS), or a Kubernetes
//             Indexed Job pod
//             (JOB_COMPLETION_INDEX; Kubernetes does not export the completion count). The
//             environment variable RESHARD_PARTITION_COUNT, when set, is the count.
//   "auto/K"  the index from the environment as above, the count K: what a rerun of some tasks
//             of an array needs (`sbatch --array=2` is an array of one task)
// Errors say which variable is missing or inconsistent.
absl::StatusOr<PartitionId> ParsePartition(absl::string_view text,
                                           const PartitionEnvLookup& env = nullptr);

// "I/K", for messages and file names.
std::string PartitionName(const PartitionId& partition);

// The partition of each file, for files of `bytes` (in plan order) dealt to `count`
// partitions: largest file first (ties: earlier in the plan first) to the partition with the
// fewest bytes so far (ties: the lowest index). Deterministic; at most 4/3 of the optimal
// largest partition.
std::vector<int> AssignPartitions(const std::vector<uint64_t>& bytes, int count);

// What `plan --partitions K` shows: the files of each partition (in plan order) and their
// bytes, for files `names` of `bytes` dealt by AssignPartitions.
struct PartitionFiles {
  std::vector<std::string> files;
  uint64_t bytes = 0;
};
std::vector<PartitionFiles> GroupByPartition(const std::vector<std::string>& names,
                                             const std::vector<uint64_t>& bytes, int count);
// The same for the data files of `plan` (its names and planned sizes).
std::vector<PartitionFiles> GroupByPartition(const CopyPlan& plan, int count);

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_PARTITION_SPEC_H_
