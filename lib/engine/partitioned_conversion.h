// One conversion run by K cooperating workers: each writes its share of the output files
// (lib/engine/partition_spec.h) into one shared staging area beside the output, and the worker
// that completes the set publishes the output with one rename.
//
// The shared area is `<parent>/.<name>.reshard-partitions/`:
//
//   split.json                        the conversion and K; created once and never replaced
//   data/                             the output folder being assembled, with the record of
//                                     each data file committed so far (output_commit.h:
//                                     data/.reshard-progress/<file>.json, plan id the split's)
//   partition-IIIII-of-KKKKK.json     worker I's record: its files' names, sizes and XXH3-64
//   partition-IIIII-of-KKKKK.claim    the worker writing partition I now (pid, host, boot id,
//                                     pid namespace, process start time, since)
//   publish.claim                     who publishes
//
// The protocol uses only operations that are atomic on NFS and Lustre: creating a file under its
// final name only when nothing is there (kvstore::Driver::CreateExclusive: link(2) on posix),
// through which split.json and the claims are created, read and removed, and rename(2); no
// flock, no appends. A
// worker (1) plans the conversion and creates split.json, or checks that the one there describes
// the same conversion split the same way (a worker of another split is refused); (2) claims its
// index by creating its .claim (a second worker of the index stops with FailedPrecondition naming
// the holder; a claim whose worker is gone is taken over, see PartitionClaim in the .cc; the claim
// is removed when the worker ends); (3) writes its files into data/, recording each
// (output_commit's per-file record); (4) renames its record into place; (5) looks for all K records: the worker that finds them claims
// publishing by creating publish.claim, checks every record against the plan (each of the
// partition's files once, at its planned size) and every other worker's file against its record
// (size and XXH3-64: the files may have changed since they were recorded; its own it hashed while
// writing), writes the index and the manifest (the commit mark) into data/ (the per-file records removed), renames data/ to the
// output and removes the area. A failed check publishes nothing, releases publish.claim and names
// the partition to rerun; a rerun sets aside its own damaged record and rewrites what does not
// match. Every worker looks after its own record is in, so the last one to finish always
// sees the set; two that finish together both see it, and exactly one creates the claim. A killed
// worker publishes nothing (its files stay `.partial` or unrecorded); rerunning the same I/K reuses
// the files recorded by their per-file records (OutputArea::FindReusable: the split's plan id,
// size and generation; then their XXH3-64) and carries on; a worker killed while
// publishing finishes publishing when rerun. `reshardctl commit OUT` (CommitPartitionedConversion)
// re-checks every record against the files and publishes: for pipelines that want an explicit last
// step, and for filesystems whose directory caches can hide a just-renamed record from another
// client.

#ifndef RESHARD_LIB_ENGINE_PARTITIONED_CONVERSION_H_
#define RESHARD_LIB_ENGINE_PARTITIONED_CONVERSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/engine/conversion.h"
#include "lib/plan/layout.h"

namespace reshard {

// The shared area's path for output folder `output_dir`.
std::string PartitionAreaPathFor(const std::string& output_dir);

// Runs `spec` as RunConversion does (an output on storage without folders, s3:// or mem://,
// as RunConversionToObjectStore does), or, when spec.partition_count > 0, as worker
// spec.partition_index of a partitioned conversion (see above; posix outputs only,
// Unimplemented otherwise). The CLI and the daemon call this.
absl::StatusOr<ConversionResult> RunAnyConversion(const ConversionSpec& spec,
                                                  const RunControl& control = {});

// OK when RunAnyConversion may write spec.output (spec.overwrite aside): it is absent or empty,
// or holds a published output of the same request. Nothing is written. The daemon checks
// this at submit.
absl::Status CheckOutputUsable(const ConversionSpec& spec);

// Re-checks every worker's record against the files in the shared area of `output_dir`
// (sizes and XXH3-64), then writes the index and manifest and publishes. FailedPrecondition
// naming the partitions that have not recorded their files yet; DataLoss naming a file that
// no longer matches its record. An output already published by the split is reported as
// found_published.
absl::StatusOr<ConversionResult> CommitPartitionedConversion(const std::string& output_dir,
                                                             const RunControl& control = {});

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_PARTITIONED_CONVERSION_H_
