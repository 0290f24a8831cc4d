#include "lib/engine/partition_spec.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

absl::StatusOr<int> ParseCount(absl::string_view text, absl::string_view what) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1 || value > kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a whole number in [1, ",
                                                   kMaxPartitions, "], not \"", text, "\""));
  }
  return value;
}

absl::StatusOr<int> ParseIndex(absl::string_view text, absl::string_view what) {
  int value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 0 || value >= kMaxPartitions) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a whole number in [0, ",
                                                   kMaxPartitions, "), not \"", text, "\""));
  }
  return value;
}

// The index and, where the engine exports it, the count of this worker; count 0 when unknown.
// RESHARD_PARTITION_COUNT, when set, is the count whatever the engine says (a rerun of some
// tasks of an array is an array of its own, with its own task count).
// `count_given`: the caller has the count (auto/K); only the index is wanted.
absl::StatusOr<PartitionId> FromEnvironment(const PartitionEnvLookup& env, bool count_given) {
  auto get = [&](const char* name) -> const char* {
    const char* value = env(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  };
  PartitionId id;
  const char* given_count = count_given ? "given" : get("RESHARD_PARTITION_COUNT");
  if (given_count != nullptr && !count_given) {
    ASSIGN_OR_RETURN(id.count, ParseCount(given_count, "RESHARD_PARTITION_COUNT"));
  }
  if (const char* task = get("SLURM_ARRAY_TASK_ID")) {
    ASSIGN_OR_RETURN(id.index, ParseIndex(task, "SLURM_ARRAY_TASK_ID"));
    // `srun -n N` inside an array task: each of the step's N tasks is a partition of its own,
    // task T's step tasks taking partitions T*N .. T*N+N-1. Slurm exports SLURM_STEP_ID and
    // SLURM_STEP_NUM_TASKS to srun steps only, not to the batch step (checked on Slurm 22.05,
    // tests/cluster/slurm_test.sh), where SLURM_PROCID is 0 and SLURM_NTASKS the job's tasks.
    int step_tasks = 1;
    if (get("SLURM_STEP_ID") != nullptr) {
      if (const char* tasks = get("SLURM_STEP_NUM_TASKS")) {
        ASSIGN_OR_RETURN(step_tasks, ParseCount(tasks, "SLURM_STEP_NUM_TASKS"));
      }
    }
    if (step_tasks > 1) {
      const char* procid = get("SLURM_PROCID");
      if (procid == nullptr) {
        return absl::InvalidArgumentError(
            "--partition auto: an srun step of several tasks in an array task, but no "
            "SLURM_PROCID; give --partition I/K");
      }
      ASSIGN_OR_RETURN(const int step_task, ParseIndex(procid, "SLURM_PROCID"));
      if (step_task >= step_tasks ||
          int64_t{id.index} * step_tasks + step_task >= int64_t{kMaxPartitions}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--partition auto: SLURM_PROCID ", step_task, " of SLURM_STEP_NUM_TASKS ", step_tasks,
            " in array task ", id.index, " is not a partition index below ", kMaxPartitions));
      }
      id.index = id.index * step_tasks + step_task;
    }
    const char* count = get("SLURM_ARRAY_TASK_COUNT");
    if (given_count != nullptr || count == nullptr) return id;
    ASSIGN_OR_RETURN(id.count, ParseCount(count, "SLURM_ARRAY_TASK_COUNT"));
    // Task ids are the partition indexes: the array must be 0..K-1.
    const char* min = get("SLURM_ARRAY_TASK_MIN");
    const char* max = get("SLURM_ARRAY_TASK_MAX");
    int min_id = 0, max_id = id.count - 1;
    if ((min != nullptr && (!absl::SimpleAtoi(min, &min_id) || min_id != 0)) ||
        (max != nullptr && (!absl::SimpleAtoi(max, &max_id) || max_id != id.count - 1))) {
      return absl::InvalidArgumentError(
          absl::StrCat("the Slurm array's task ids are not 0..", id.count - 1, " (",
                       min ? min : "?", "-", max ? max : "?", ", ", id.count,
                       " tasks): number the tasks --array=0-K-1, and give K (--partition auto/K or "
                       "RESHARD_PARTITION_COUNT=K) when rerunning some of them"));
    }
    if (int64_t{id.count} * step_tasks > int64_t{kMaxPartitions}) {
      return absl::InvalidArgumentError(
          absl::StrCat("--partition auto: ", id.count, " array tasks of ", step_tasks,
                       " srun tasks each are more than ", kMaxPartitions, " partitions"));
    }
    id.count *= step_tasks;
    return id;
  }
  if (const char* procid = get("SLURM_PROCID")) {
    ASSIGN_OR_RETURN(id.index, ParseIndex(procid, "SLURM_PROCID"));
    if (const char* ntasks = get("SLURM_NTASKS"); ntasks != nullptr && given_count == nullptr) {
      ASSIGN_OR_RETURN(id.count, ParseCount(ntasks, "SLURM_NTASKS"));
    }
    return id;
  }
  if (const char* index = get("JOB_COMPLETION_INDEX")) {
    ASSIGN_OR_RETURN(id.index, ParseIndex(index, "JOB_COMPLETION_INDEX"));
    return id;
  }
  return absl::InvalidArgumentError(
      "--partition auto: not in a Slurm array task (SLURM_ARRAY_TASK_ID), an srun step "
      "(SLURM_PROCID) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX); give --partition I/K");
}

}  // namespace

absl::StatusOr<PartitionId> ParsePartition(absl::string_view text, const PartitionEnvLookup& env) {
  const PartitionEnvLookup lookup =
      env ? env : PartitionEnvLookup([](const char* name) { return std::getenv(name); });
  PartitionId id;
  if (text == "auto" || absl::StartsWith(text, "auto/")) {
    ASSIGN_OR_RETURN(id, FromEnvironment(lookup, absl::StartsWith(text, "auto/")));
    // K given on the command line is the count, whatever the engine says.
    if (absl::ConsumePrefix(&text, "auto/")) {
      ASSIGN_OR_RETURN(id.count, ParseCount(text, "the partition count"));
    }
    if (id.count == 0) {
      return absl::InvalidArgumentError(
          "--partition auto: the environment gives this worker's index but not the number of "
          "workers; give it as --partition auto/K (or set RESHARD_PARTITION_COUNT)");
    }
  } else {
    const std::vector<absl::string_view> fields = absl::StrSplit(text, '/');
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--partition must be I/K, auto or auto/K, not \"", text, "\""));
    }
    ASSIGN_OR_RETURN(id.index, ParseIndex(fields[0], "the partition index"));
    ASSIGN_OR_RETURN(id.count, ParseCount(fields[1], "the partition count"));
  }
  if (id.index >= id.count) {
    return absl::InvalidArgumentError(absl::StrCat("partition index ", id.index,
                                                   " is not below the partition count ", id.count,
                                                   " (indexes are 0-based)"));
  }
  return id;
}

std::string PartitionName(const PartitionId& partition) {
  return absl::StrCat(partition.index, "/", partition.count);
}

std::vector<int> AssignPartitions(const std::vector<uint64_t>& bytes, int count) {
  std::vector<int> assignment(bytes.size(), 0);
  if (count <= 1) return assignment;
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<uint64_t> load(static_cast<size_t>(count), 0);
  for (size_t file : order) {
    const auto lightest = std::min_element(load.begin(), load.end());  // first of equals
    *lightest += bytes[file];
    assignment[file] = static_cast<int>(lightest - load.begin());
  }
  return assignment;
}

std::vector<PartitionFiles> GroupByPartition(const std::vector<std::string>& names,
                                             const std::vector<uint64_t>& bytes, int count) {
  const std::vector<int> assignment = AssignPartitions(bytes, count);
  std::vector<PartitionFiles> partitions(static_cast<size_t>(std::max(count, 1)));
  for (size_t f = 0; f < names.size() && f < bytes.size(); ++f) {
    partitions[assignment[f]].files.push_back(names[f]);
    partitions[assignment[f]].bytes += bytes[f];
  }
  return partitions;
}

std::vector<PartitionFiles> GroupByPartition(const CopyPlan& plan, int count) {
  std::vector<std::string> names;
  std::vector<uint64_t> bytes;
  for (const FilePlan& file : plan.files) {
    names.push_back(file.name);
    bytes.push_back(file.bytes);
  }
  return GroupByPartition(names, bytes, count);
}

}  // namespace reshard
