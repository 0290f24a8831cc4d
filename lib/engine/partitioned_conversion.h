// One conversion run by K cooperating workers: each writes its share of the output files
// (lib/engine/partition_spec.h), and the worker that completes the set publishes the output.
// It runs on every kvstore::Driver: posix, s3:// and mem://.
//
// The workers meet in the shared area `<parent>/.<name>.reshard-partitions/` beside output
// `<parent>/<name>` (lib/engine/partition_area.h: split.json, the partitions' records, the
// claims and their leases). The data files are written, each with its output_commit record
// (output_commit.h; plan id the split's), where the driver publishes from: on posix into the
// area's data/ folder, renamed to the output once complete, so the output's name never holds
// a partial output; on stores without rename (S3, memory) in place in the output under its
// in-progress marker, the manifest, written last, being the commit mark.
//
// The protocol uses only Driver::CreateExclusive (link(2) on posix, PUT with If-None-Match: *
// on S3) for what exactly one worker may do, whole-file writes, Stat (sizes and generations),
// List and Delete, plus rename(2) for the posix publish; no flock, no appends. A worker
// (1) plans the conversion and creates split.json, or checks that the one there describes the
// same conversion split the same way (a worker of another split is refused); (2) claims its
// index (a second worker of the index stops with FailedPrecondition naming the holder; a stale
// claim is taken over by one worker, see partition_area.h; the claim is removed when the
// worker ends); (3) drops its own unfinished writes of a killed attempt (posix `.partial`
// files, S3 multipart uploads) and writes its files, recording each; (4) writes its partition
// record; (5) looks for all K records: the worker that finds them claims publishing by creating
// publish.claim, checks every record against the plan (each of the partition's files once, at
// its planned size) and every other worker's file against its record (posix: size and
// XXH3-64, rehashed; S3 and memory: size and generation of its per-file record, the ETag),
// writes the index and the manifest, publishes and removes the area. In place, overwriting
// an earlier output removes its manifest before any data file is written and what it held
// beyond the plan's files at publishing. A failed check publishes nothing, releases
// publish.claim and names the partition to rerun; a rerun sets aside its own damaged record
// and rewrites what does not match. Every worker looks after its own record is in, so the
// last one to finish always sees the set; two that finish together both see it, and exactly
// one creates the claim. A killed worker publishes nothing; rerunning the same I/K reuses the
// files recorded by their per-file records (OutputArea::FindReusable) and carries on; a
// worker killed while publishing finishes publishing when rerun. `reshardctl commit OUT`
// (CommitPartitionedConversion) re-checks every record against the files and publishes: for
// pipelines that want an explicit last step, and for filesystems whose directory caches can
// hide a just-written record from another client.

#ifndef RESHARD_LIB_ENGINE_PARTITIONED_CONVERSION_H_
#define RESHARD_LIB_ENGINE_PARTITIONED_CONVERSION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/engine/conversion.h"
#include "lib/plan/layout.h"

namespace reshard {

// The shared area's path for output `output_dir` (partition_area.h); empty when the output
// has no place beside it (a whole bucket).
std::string PartitionAreaPathFor(const std::string& output_dir);

// Runs `spec` as RunConversion does (an output on storage without folders, s3:// or mem://,
// as RunConversionToObjectStore does), or, when spec.partition_count > 0, as worker
// spec.partition_index of a partitioned conversion (see above). The CLI and the daemon call
// this.
absl::StatusOr<ConversionResult> RunAnyConversion(const ConversionSpec& spec,
                                                  const RunControl& control = {});

// OK when RunAnyConversion may write spec.output (spec.overwrite aside): it is absent or empty,
// or holds a published output of the same request. Nothing is written. The daemon checks
// this at submit.
absl::Status CheckOutputUsable(const ConversionSpec& spec);

// Re-checks every worker's record against the files of the split of `output_dir` (see
// above), then writes the index and manifest and publishes. FailedPrecondition
// naming the partitions that have not recorded their files yet; DataLoss naming a file that
// no longer matches its record. An output already published by the split is reported as
// found_published.
absl::StatusOr<ConversionResult> CommitPartitionedConversion(const std::string& output_dir,
                                                             const RunControl& control = {});

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_PARTITIONED_CONVERSION_H_
